"""bench_watch.py runs end to end on a tiny setting (so the committed command does not rot) and writes every
figure the issue asks of it: the floor ratio on the demo model and ViT-S/16, and the overhead with a log_dir."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a subprocess that builds ViT-S/16

BENCH = Path(__file__).parent.parent / "benchmarks"


def test_bench_watch_reports_floor_ratios_and_overhead_with_a_log_dir(tmp_path):
    out = tmp_path / "watch.json"
    proc = subprocess.run([sys.executable, str(BENCH / "bench_watch.py"), "--rounds", "1", "--steps", "4",
                           "--every", "2", "--probe-images", "16", "--vit-probe-images", "4", "--vit-samples", "1",
                           "--threads", "1", "--device", "cpu", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["log_dir"] is True and len(result["sample_s"]) == 2
    assert result["floor_ratio"] > 0 and result["floor_ratio_with_exports"] >= result["floor_ratio"]
    assert len(result["overhead_ratio_series"]) == 1 and result["overhead_ratio_median"] > 0  # the 2nd sample's
    vit = result["vit_small"]
    assert vit["probe_images"] == 4 and vit["floor_ratio"] > 0
