"""The examples run as scripts, end to end, with small settings."""

import json
import subprocess
import sys
from pathlib import Path

from run_dirs import run_dir

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_plain_loop_example(tmp_path):
    proc = subprocess.run([sys.executable, str(EXAMPLES / "plain_loop.py"), "--steps", "4", "--every", "2",
                           "--log-dir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "last sample at step 4" in proc.stdout
    steps = [json.loads(line)["step"] for line in (run_dir(tmp_path) / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2, 4]


def test_truncate_example(tmp_path):
    out = tmp_path / "t.pt"
    proc = subprocess.run([sys.executable, str(EXAMPLES / "truncate_example.py"), "--out", str(out),
                           "--train-epochs", "1", "--heal-epochs", "1", "--budget", "2"], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "uncut accuracy validation n=" in proc.stdout and "kept source blocks" in proc.stdout and out.is_file()


def run_example(name, *args):
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), *map(str, args)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def sampled_steps(root):
    """Steps recorded in the one metrics.jsonl written somewhere below ``root``."""
    (path,) = Path(root).rglob("metrics.jsonl")
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_lightning_example(tmp_path):
    run_example("lightning_example.py", "--steps", 4, "--every", 2, "--log-dir", tmp_path)
    assert sampled_steps(tmp_path) == [2, 4]


def test_transformers_example(tmp_path):
    run_example("transformers_example.py", "--steps", 4, "--every", 2, "--out", tmp_path)
    assert sampled_steps(tmp_path) == [2, 4]


def test_timm_train_example(tmp_path):
    run_example("timm_train_example.py", "--epochs", 1, "--every", 2, "--log-dir", tmp_path)
    assert sampled_steps(tmp_path) == [*range(2, 31, 2), 31]  # 31 updates of 128 images; 31: the final sample
