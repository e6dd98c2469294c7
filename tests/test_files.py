"""Atomic writes: a full disk or a killed writer leaves nothing a user would mistake for output."""

import errno
import os
import subprocess
import sys
import textwrap

import pytest
import timm
import torch
from click.testing import CliRunner

from isiwatch._utils import files
from isiwatch._utils.files import WriteError, atomic_files, atomic_write
from isiwatch.cli.commands import main
from isiwatch.io.checkpoint import load_checkpoint, save_checkpoint

KWARGS = dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=32, depth=2, num_heads=2)
ARCH = "vit_tiny_patch16_224"


@pytest.fixture(scope="module")
def state():
    torch.manual_seed(0)
    return timm.create_model(ARCH, pretrained=False, **KWARGS).state_dict()


@pytest.fixture
def full_disk(monkeypatch, tmp_path):
    """os.write into tmp_path takes 1000 bytes, then fails as a full disk does."""
    real, written = os.write, {"bytes": 0}

    def write(fd, data):
        if not os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path.resolve())):
            return real(fd, data)
        if written["bytes"] >= 1000:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        n = real(fd, bytes(memoryview(data)[:1000 - written["bytes"]]))
        written["bytes"] += n
        return n

    monkeypatch.setattr(os, "write", write)


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_full_disk_names_the_file_and_leaves_nothing(state, tmp_path, full_disk, fmt):
    out = tmp_path / f"o.{fmt}"
    with pytest.raises(WriteError) as caught:
        save_checkpoint(out, ARCH, KWARGS, state, fmt=fmt)
    assert str(caught.value) == f"{out}: cannot write (No space left on device)"
    assert caught.value.errno == errno.ENOSPC and list(tmp_path.iterdir()) == []


def test_full_disk_through_the_cli_is_one_line(state, tmp_path):
    source = save_checkpoint(tmp_path / "src" / "m.pt", ARCH, KWARGS, state)
    out = tmp_path / "out" / "special.pt"
    out.parent.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        real = os.write

        def write(fd, data):
            if os.readlink(f"/proc/self/fd/{fd}").startswith(str(out.parent.resolve())):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(fd, data)

        mp.setattr(os, "write", write)
        result = CliRunner().invoke(main, ["specialize", str(source), "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert result.output.strip() == f"Error: {out}: cannot write (No space left on device)"
    assert list(out.parent.iterdir()) == []


def test_a_failed_block_keeps_the_old_file(tmp_path):
    target = tmp_path / "x.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_write(target) as fh:
        fh.write(b"new, half written")
        raise RuntimeError("writer failed")
    assert target.read_text() == "old" and list(tmp_path.iterdir()) == [target]


KILLED_WRITER = """
import os, signal, sys
from isiwatch._utils.files import atomic_write
with atomic_write(sys.argv[1]) as fh:
    fh.write(b"x" * 3_000_000)
    fh.flush()
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_writer_leaves_a_marked_temporary_that_the_next_write_removes(state, tmp_path):
    out = tmp_path / "model.pt"
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(KILLED_WRITER), str(out)], capture_output=True)
    assert proc.returncode == -9, proc.stderr
    (left,) = tmp_path.iterdir()  # what kill -9 leaves: hidden, isiwatch's, temporary, not a *.pt
    assert left.name.startswith(".model.pt.isiwatch-") and left.name.endswith(".tmp") and left.suffix != ".pt"
    other_target = tmp_path / left.name.replace(".model.pt.", ".other.pt.")
    other_target.write_bytes(b"")  # another target's temporary is not this write's business
    live = tmp_path / f".model.pt.isiwatch-{files._HOST}-{os.getppid()}-abcdefgh.tmp"
    live.write_bytes(b"")  # a live process's: it may still be writing
    foreign = tmp_path / ".model.pt.abcdefgh.tmp"
    foreign.write_bytes(b"")  # not isiwatch's
    save_checkpoint(out, ARCH, KWARGS, state)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([out.name, other_target.name, live.name,
                                                                foreign.name])
    assert load_checkpoint(out).model_kwargs["depth"] == 2


def test_atomic_files_moves_all_or_nothing(tmp_path):
    out = tmp_path / "new"
    with pytest.raises(RuntimeError), atomic_files(out) as stage:
        (stage / "a.txt").write_text("a")
        raise RuntimeError("second file failed")
    assert list(tmp_path.iterdir()) == []
    with atomic_files(out, last=("b.txt",)) as stage:
        (stage / "a.txt").write_text("a")
        (stage / "b.txt").write_text("b")
    assert sorted(p.name for p in out.iterdir()) == ["a.txt", "b.txt"]
    with pytest.raises(RuntimeError), atomic_files(out) as stage:  # an existing folder keeps the old pair
        (stage / "a.txt").write_text("A")
        raise RuntimeError("second file failed")
    assert sorted(p.name for p in out.iterdir()) == ["a.txt", "b.txt"] and (out / "a.txt").read_text() == "a"
    with atomic_files(out, last=("b.txt",)) as stage:
        (stage / "a.txt").write_text("A")
        (stage / "b.txt").write_text("B")
    assert [(out / n).read_text() for n in ("a.txt", "b.txt")] == ["A", "B"] and len(list(out.iterdir())) == 2


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_new_output_folders_and_files_follow_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        with atomic_files(tmp_path / "out") as stage:
            (stage / "a.json").write_text("{}")
        with atomic_write(tmp_path / "b.json") as fh:
            fh.write(b"{}")
    finally:
        os.umask(old)
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o777 & ~umask  # was 0700 whatever the umask
    assert (tmp_path / "b.json").stat().st_mode & 0o777 == 0o666 & ~umask
