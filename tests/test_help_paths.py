"""What ``--help`` points to ships with isiwatch: the wheel holds no ``benchmarks/`` folder, so no command's help
may send a user there (``demo --help`` named benchmarks/RESULTS.md)."""

import pytest
from click.testing import CliRunner

from isiwatch.cli.commands import main


@pytest.mark.parametrize("command", [[], *([name] for name in main.commands)])
def test_help_names_no_file_the_wheel_lacks(command):
    done = CliRunner().invoke(main, [*command, "--help"])
    assert done.exit_code == 0, done.output
    assert "benchmarks/" not in done.output and "RESULTS.md" not in done.output, done.output
