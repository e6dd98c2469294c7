"""``truncate``'s options are declared once (`TruncateOptions`): the function's signature, the request and the
command line's defaults follow it."""

import dataclasses
import inspect

import click
from click.testing import CliRunner

import isiwatch
from isiwatch.cli.commands import main
from isiwatch.io.timm_data import DEFAULT_BATCH_SIZE, DEFAULT_WORKERS
from isiwatch.truncation.options import OPTION_DEFAULTS, TruncateOptions
from isiwatch.truncation.request import TruncateRequest


def test_truncate_takes_exactly_the_declared_options_with_their_defaults():
    parameters = inspect.signature(isiwatch.truncate).parameters
    options = {f.name: f.default for f in dataclasses.fields(TruncateOptions)}
    assert list(parameters)[:2] == ["checkpoint_or_model", "out"]
    assert {name: p.default for name, p in list(parameters.items())[2:]} == options
    assert all(p.kind is p.KEYWORD_ONLY for p in list(parameters.values())[2:])


def test_the_request_is_the_source_and_the_out_path_with_the_declared_options():
    fields = [f.name for f in dataclasses.fields(TruncateRequest)]
    assert set(fields) == {"checkpoint", "out", *OPTION_DEFAULTS}
    assert list(inspect.signature(TruncateRequest).parameters)[:2] == ["checkpoint", "out"]


def test_the_reader_defaults_are_the_io_layer_s():
    assert (OPTION_DEFAULTS["batch_size"], OPTION_DEFAULTS["workers"]) == (DEFAULT_BATCH_SIZE, DEFAULT_WORKERS)


def test_every_shared_command_line_default_is_the_python_default():
    command = main.commands["truncate"]
    context = click.Context(command)
    cli_only = {"device", "progress"}  # "auto": CUDA when there is one; None: bars when stderr is a terminal
    for param in command.params:
        if OPTION_DEFAULTS.get(str(param.name)) is not None and param.name not in cli_only:
            assert param.get_default(context) == OPTION_DEFAULTS[str(param.name)], param.name
    assert CliRunner().invoke(main, ["truncate", "--help"]).exit_code == 0
