"""`isiwatch report` ends with the commands that fit the run: where report.html is, TensorBoard on the run's folder,
and the truncate command only when the run saw a reason for fewer blocks and names a checkpoint and images that
exist; the printed truncate command is one the CLI's parser accepts."""

import shlex

import pytest
from click.testing import CliRunner
from test_watch import tiny_vit

import isiwatch
from isiwatch import Watch
from isiwatch._utils.files import write_json
from isiwatch.cli.commands import main
from isiwatch.cli.offline import analysis_record
from isiwatch.cli.truncate import truncate
from isiwatch.io.checkpoint import save_checkpoint
from isiwatch.io.data import embedded_digits
from isiwatch.measure.phases import Phases


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    """A Watch's log folder (TensorBoard events, metrics.jsonl, alerts.jsonl) and the model it watched."""
    x, y = embedded_digits()
    model, run = tiny_vit(), tmp_path_factory.mktemp("next") / "run"
    with Watch(model, x[4000:4064], y[4000:4064], every_n_steps=1, log_dir=run, run_folder=".") as watch:
        watch.step(1)
        watch.step(2)
    return run, model, (x[4000:4064], y[4000:4064])


def report_lines(run, out):
    result = CliRunner().invoke(main, ["report", str(run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def truncate_args(line):
    """The arguments of the truncate command a next-steps line prints, after ``isiwatch truncate``."""
    words = shlex.split(line.split(": ", 1)[1])
    assert words[:2] == ["isiwatch", "truncate"]
    return words[2:]


def test_a_watch_log_ends_with_the_report_and_tensorboard_and_no_truncate_without_a_checkpoint(watched, tmp_path):
    run, _, _ = watched
    lines = report_lines(run, tmp_path / "r")
    assert lines[-3:] == ["next:", f"  open the report: {tmp_path / 'r' / 'report.html'}",
                          f"  browse the run's curves: tensorboard --logdir {run}"]


def test_an_analysed_checkpoint_with_a_flat_stretch_gets_a_truncate_command_the_cli_accepts(watched, tmp_path):
    run, model, (x, y) = watched
    checkpoint = tmp_path / "model with space.pt"
    save_checkpoint(checkpoint, "vit_tiny_patch16_224", {
        "img_size": 28, "patch_size": 7, "in_chans": 1, "num_classes": 10, "embed_dim": 32, "depth": 4,
        "num_heads": 2}, model.state_dict())
    result = isiwatch.analyze(model, x, y)
    result.phases = Phases((0, 2), None, (3, 3))  # a slow start in the trained model: a reason for fewer blocks
    result.model_info.update({"checkpoint": str(checkpoint), "data": "mnist"})
    write_json(run / "analysis.json", analysis_record(result))
    try:
        line = report_lines(run, tmp_path / "r")[-1]
        assert line.startswith("  test a cut within 1 accuracy point of the trained model: isiwatch truncate ")
        args = truncate_args(line)
        assert args == [str(checkpoint), "--data", "mnist", "--analysis", str(run / "analysis.json"),
                        "--max-drop", "1", "--out", str(run / "truncated-max-drop-1.pt")]
        assert truncate.make_context("truncate", args).params["max_drop"] == 1  # parsed and checked as typed

        checkpoint.unlink()  # moved since: no command that would not run
        assert "isiwatch truncate" not in "\n".join(report_lines(run, tmp_path / "r2"))
    finally:
        (run / "analysis.json").unlink()
