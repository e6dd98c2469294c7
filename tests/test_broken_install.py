"""A torch / torchvision pair that does not match is named in one line with the install line that fixes it, not
as ``internal error (RuntimeError): operator torchvision::nms does not exist``."""

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def test_a_torchvision_built_for_another_torch_is_named_with_the_fix(tmp_path):
    stub = tmp_path / "stub"
    (stub / "torchvision").mkdir(parents=True)
    # what a CUDA torchvision raises beside a CPU torch, while it registers its operators on import
    (stub / "torchvision" / "__init__.py").write_text(
        'raise RuntimeError("operator torchvision::nms does not exist")\n')
    (stub / "torchvision-0.99.0.dist-info").mkdir()
    (stub / "torchvision-0.99.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torchvision\nVersion: 0.99.0\nRequires-Dist: torch==2.99.0\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(stub), str(SRC)])}
    done = subprocess.run([sys.executable, "-m", "isiwatch.cli", "demo", "--quick", "--out", str(tmp_path / "demo")],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("Error: importing torchvision failed (RuntimeError: operator torchvision::nms does not "
                           "exist): the installed torch ")
    torch = importlib.metadata.version("torch")
    assert f"torch {torch}, torchvision 0.99.0, which requires torch==2.99.0 do not work together" in line
    base = torch.split("+")[0]
    assert line.split("install a matching pair from one index: ")[1].startswith(
        f"pip install --force-reinstall torch=={base} torchvision==0.99.0")
    assert not (tmp_path / "demo").exists()


def test_other_failures_are_not_blamed_on_the_install():
    from isiwatch.cli.environment import broken_install

    try:
        raise RuntimeError("a bug of ours")
    except RuntimeError as exc:
        assert broken_install(exc) is None


def test_every_cpu_install_line_installs_torch_and_torchvision_together():
    """A CPU torch alone beside the CUDA torchvision pip picks by default is the mismatch above."""
    root = SRC.parent
    pages = [root / "README.md", root / "CONTRIBUTING.md", *sorted((root / "docs").glob("*.md"))]
    lines = [(page.name, line) for page in pages for line in page.read_text(encoding="utf-8").splitlines()
             if "download.pytorch.org/whl/" in line]
    assert lines, "no install line found: the test reads the wrong files"
    alone = [(name, line) for name, line in lines if "pip install torch torchvision" not in line]
    assert not alone, f"install torch and torchvision from one index: {alone}"
