"""bench_watch.py runs end to end on a tiny setting (so the committed command does not rot) and writes every
figure the issue asks of it: the floor ratio on the demo model and ViT-S/16, the per-sample and whole-run overhead
with a log_dir, where the whole-run difference goes, and the RSS over many samples with a log_dir."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a subprocess that builds ViT-S/16

BENCH = Path(__file__).parent.parent / "benchmarks"


def test_bench_watch_reports_floor_ratios_and_overhead_with_a_log_dir(tmp_path):
    out = tmp_path / "watch.json"
    proc = subprocess.run([sys.executable, str(BENCH / "bench_watch.py"), "--rounds", "2", "--steps", "4",
                           "--every", "2", "--probe-images", "16", "--vit-probe-images", "4", "--vit-samples", "2",
                           "--floor-pairs", "2",
                           "--rss-samples", "24", "--rss-every", "10", "--rss-probe-images", "8", "--threads", "1",
                           "--device", "cpu", "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["log_dir"] is True and len(result["sample_s"]) == 4  # steps 2, 4, 6, 8
    assert result["args"]["rounds"] == "2" and len(result["plain_s"]) == len(result["watched_s"]) == 2
    assert result["whole_run_ratio"] == pytest.approx(sum(result["watched_s"]) / sum(result["plain_s"]) - 1)
    assert 0 < result["per_sample_ratio"] <= result["per_sample_ratio_with_exports"]
    assert result["watch_start_s"] > 0 and result["watch_close_s"] > 0
    assert result["step_ratio"]["after_sample"] > 0
    rss = result["rss"]
    assert rss["samples"] == 24 and rss["from_sample"] == 20 and set(rss["rss_mb"]) == {"10", "20", "24"}
    assert rss["growth_mb"] == pytest.approx(rss["rss_mb"]["24"] - rss["rss_mb"]["20"])
    if sys.platform == "linux":  # glibc's heap in use, read in the fresh process the RSS run takes
        assert set(rss["malloc_in_use_mb"]) == {"10", "20", "24"} and 0 < rss["malloc_in_use_mb"]["24"]
        assert rss["malloc_in_use_mb"]["24"] < rss["rss_mb"]["24"]
        assert rss["in_use_growth_mb"] == pytest.approx(rss["malloc_in_use_mb"]["24"] - rss["malloc_in_use_mb"]["20"])
    pairs = result["floor_pairs"]
    assert pairs["pairs"] == 2 and result["floor_ratio"] == pytest.approx(pairs["sample_s"] / pairs["forward_s"])
    # the third arm's samples skip the linear probes (the script raises if one ran them, or if a sample did not)
    assert pairs["floor_ratio_without_probes"] == pytest.approx(pairs["sample_without_probes_s"] / pairs["forward_s"])
    assert 0 < result["rounds_floor_ratio"] <= result["floor_ratio_with_exports"]
    assert len(result["overhead_ratio_series"]) == 3 and result["overhead_ratio_median"] > 0  # all but the 1st
    vit = result["vit_small"]
    assert vit["probe_images"] == 4 and vit["pairs"] == 2
    assert vit["floor_ratio"] == pytest.approx(vit["sample_s"] / vit["forward_s"])
