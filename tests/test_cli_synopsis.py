"""The command-line synopsis of docs/cli.md is the one the click commands render: every option of every command,
as they define it (python -m isiwatch.cli.synopsis prints the block to paste)."""

from pathlib import Path

from isiwatch.cli.synopsis import documented, synopsis

PAGE = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def test_the_documented_synopsis_is_the_one_the_commands_render():
    assert documented(PAGE.read_text()) == synopsis(), "run python -m isiwatch.cli.synopsis and paste its output"


def test_the_synopsis_lists_every_option_of_every_command():
    import click

    from isiwatch.cli.commands import main

    text = synopsis()
    for name, command in main.commands.items():
        commands = command.commands.values() if isinstance(command, click.Group) else [command]
        for cmd in commands:
            for param in cmd.params:
                if isinstance(param, click.Option) and param.name != "help":
                    assert param.opts[0] in text, (name, param.opts[0])
