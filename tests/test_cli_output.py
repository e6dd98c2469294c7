"""What a user notices in a command's output: progress bars only on a terminal (a flag forces them) and output
files and folders that follow the umask."""

import os
import sys

import pytest
import timm
import torch
from click.testing import CliRunner

from isiwatch._utils.progress import show_progress
from isiwatch.cli.commands import main
from isiwatch.io.checkpoint import save_checkpoint

KWARGS = {"img_size": 28, "patch_size": 7, "in_chans": 1, "num_classes": 10, "embed_dim": 16, "depth": 2,
          "num_heads": 2}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", **KWARGS)
    return save_checkpoint(tmp_path_factory.mktemp("ckpt") / "model.pt", "vit_tiny_patch16_224", KWARGS,
                           model.state_dict())


def test_progress_bars_only_on_a_terminal_unless_forced(checkpoint, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["truncate", str(checkpoint), "--keep", "1", "--epochs", "1", "--images", "64", "--device", "cpu"]
    redirected = CliRunner().invoke(main, [*args, "--out", "a.pt"])  # stderr is no terminal here
    assert redirected.exit_code == 0, redirected.output
    assert "it/s" not in redirected.stderr and "\r" not in redirected.stderr
    forced = CliRunner().invoke(main, [*args, "--out", "b.pt", "--progress"])
    assert forced.exit_code == 0, forced.output
    assert "healing" in forced.stderr or "it/s" in forced.stderr or "\r" in forced.stderr, forced.stderr
    assert show_progress(False) is False and show_progress(True) is True


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_command_outputs_follow_the_umask(checkpoint, tmp_path, monkeypatch, umask):
    monkeypatch.chdir(tmp_path)
    old = os.umask(umask)
    try:
        analysed = CliRunner().invoke(main, ["analyze", str(checkpoint), "--images", "16", "--out", "a",
                                             "--device", "cpu"])
        cut = CliRunner().invoke(main, ["specialize", str(checkpoint), "--out", "s.pt"])
    finally:
        os.umask(old)
    assert analysed.exit_code == 0 and cut.exit_code == 0, analysed.output + cut.output
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o777 & ~umask
    for path in (tmp_path / "a" / "analysis.json", tmp_path / "s.pt"):
        assert path.stat().st_mode & 0o777 == 0o666 & ~umask, path


def test_an_output_that_replaces_an_existing_file_says_so(checkpoint, tmp_path, monkeypatch):
    """Outputs are replaced as torch.save and Lightning's checkpoints replace theirs (atomically: the old file stays
    whole until the new one is complete), and the line naming each says when one was there before (issue 33 #5)."""
    monkeypatch.chdir(tmp_path)
    first = CliRunner().invoke(main, ["specialize", str(checkpoint), "--out", "s.pt"])
    again = CliRunner().invoke(main, ["specialize", str(checkpoint), "--out", "s.pt"])
    assert first.exit_code == 0 and again.exit_code == 0, first.output + again.output
    assert first.stdout.splitlines()[-1] == "wrote s.pt"
    assert again.stdout.splitlines()[-1] == "wrote s.pt (replaced the existing file)"
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "analysis.json").write_text("{}")  # an earlier analysis; curves.png is new
    analysed = CliRunner().invoke(main, ["analyze", str(checkpoint), "--images", "16", "--out", "a", "--device",
                                         "cpu"])
    assert analysed.exit_code == 0, analysed.output
    assert analysed.stdout.splitlines()[-2:] == ["wrote a/analysis.json (replaced the existing file)",
                                                 "wrote a/curves.png"]


def test_the_demo_removes_an_earlier_demo_run_and_refuses_a_folder_in_use(tmp_path):
    """A second demo into the same run folder says so and removes every file the earlier demo wrote first (an
    interrupted re-run would otherwise leave its partial log beside the earlier model, truncation and report), and
    leaves the user's own files; a folder a Watch writes now is refused in one line."""
    from isiwatch.cli.demo import _start_afresh
    from isiwatch.watch.log_folder import LogFolderLock

    lines: list[str] = []
    _start_afresh(tmp_path / "new", lines.append)
    _start_afresh(tmp_path, lines.append)  # empty
    assert lines == []
    for name in ("metrics.jsonl", "alerts.jsonl", "events.out.tfevents.1.host.2.0", "model.pt", "analysis.json",
                 "truncated.pt", "truncate_report.json", "notes.txt"):
        (tmp_path / name).write_text("earlier run")
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "report.html").write_text("earlier run")
    _start_afresh(tmp_path, lines.append)
    assert len(lines) == 1 and lines[0].startswith(f"removing the earlier demo run's files in {tmp_path}/ (")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    lock = LogFolderLock(tmp_path, "training")
    (tmp_path / "metrics.jsonl").write_text("the other run's")
    with pytest.raises(ValueError, match=r"is in use by run 'training' \(pid \d+ on .*\): pass --out"):
        _start_afresh(tmp_path, lines.append)
    assert (tmp_path / "metrics.jsonl").read_text() == "the other run's"
    lock.release()


def test_a_missing_package_is_named_with_what_to_install_not_an_internal_error(checkpoint, tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "mlflow" or m.startswith("mlflow.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mlflow", None)  # `import mlflow` fails as on a base install
    # the command reaches an optional import (fault injected where the analysis would start)
    monkeypatch.setattr("isiwatch.cli.offline.analyze_checkpoint", lambda *a, **k: __import__("mlflow"))
    result = CliRunner().invoke(main, ["analyze", str(checkpoint), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1
    assert result.output == ('Error: this needs the mlflow package, which is not installed: pip install '
                             '"isiwatch[mlflow]"\n'), result.output
