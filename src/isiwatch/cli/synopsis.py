"""The command-line synopsis of ``docs/cli.md``, rendered from the click commands themselves so it lists every
option as the commands define it. ``python -m isiwatch.cli.synopsis`` prints it; ``tests/test_cli_synopsis.py``
holds the page's block (between ``<!-- synopsis -->`` markers) equal to it."""

from __future__ import annotations

import click

#: Width of a synopsis line, and the indent of its continuation lines.
WIDTH, INDENT = 116, 23
START, END = "<!-- synopsis -->", "<!-- /synopsis -->"


def _metavar(param: click.Parameter, ctx: click.Context) -> str:
    if param.metavar:
        return param.metavar
    kind = param.type
    if isinstance(kind, click.Choice):
        return "|".join(map(str, kind.choices))
    if isinstance(kind, (click.types.IntParamType, click.IntRange)):
        return "N"
    if isinstance(kind, (click.types.FloatParamType, click.FloatRange)):
        return "X"
    return param.make_metavar(ctx)


def _word(param: click.Parameter, ctx: click.Context) -> str:
    """One parameter as the synopsis shows it: ``ARG``, ``--out PATH``, ``[--quick]``, ``[--norms/--no-norms]``."""
    if isinstance(param, click.Argument):
        return param.make_metavar(ctx)
    assert isinstance(param, click.Option)
    names = "/".join(param.opts[:1] + param.secondary_opts[:1])
    word = names if param.is_flag else f"{names} {_metavar(param, ctx)}"
    return word if param.required else f"[{word}]"


def _lines(path: str, command: click.Command, parent: click.Context) -> list[str]:
    ctx = click.Context(command, parent=parent, info_name=path.split()[-1])
    if isinstance(command, click.Group):
        return [line for name, sub in sorted(command.commands.items()) for line in _lines(f"{path} {name}", sub, ctx)]
    words = [_word(p, ctx) for p in command.params if not (isinstance(p, click.Option) and p.name == "help")]
    lines = [f"{path:<{INDENT - 1}}" if len(path) < INDENT - 1 else path]
    for word in words:  # an option and its metavar stay on one line
        if len(lines[-1]) + 1 + len(word) > WIDTH:
            lines.append(" " * (INDENT - 1))
        lines[-1] += " " + word
    return lines


def synopsis() -> str:
    """Every command of ``isiwatch`` with every option, one command per line (wrapped), in a fenced block."""
    from .commands import main

    root = click.Context(main, info_name="isiwatch")
    order = ["demo", "analyze", "truncate", "specialize", "report", "config"]
    names = order + sorted(set(main.commands) - set(order))
    lines = [line for name in names if name in main.commands
             for line in _lines(f"isiwatch {name}", main.commands[name], root)]
    lines.append("isiwatch --config isiwatch.yaml COMMAND ...    # command options from the file's section for COMMAND")
    return "```\n" + "\n".join(lines) + "\n```"


def documented(page: str) -> str:
    """The synopsis block between the markers of a docs page's text."""
    return page.split(START, 1)[1].split(END, 1)[0].strip()


if __name__ == "__main__":
    print(synopsis())
