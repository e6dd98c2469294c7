"""What a user notices in a command's output: progress bars only on a terminal (a flag forces them) and output
files and folders that follow the umask."""

import os

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
