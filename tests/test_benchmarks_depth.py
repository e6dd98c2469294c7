"""The depth benchmarks run end to end on a tiny setting (so the committed commands do not rot)."""

import json
import subprocess
import sys
from pathlib import Path

from isiwatch.measure.depth import RULES

BENCH = Path(__file__).parent.parent / "benchmarks"


def run(script, *args):
    proc = subprocess.run([sys.executable, str(BENCH / script), *map(str, args)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_sweep_rule_scores_and_auto_truncation_on_two_tiny_depths(tmp_path):
    work, results = tmp_path / "work", tmp_path / "results"
    common = ["--tasks", "digits", "--seeds", "0", "--epochs", "1", "--work", work, "--results", results]
    run("bench_depth.py", "--depths", 1, 2, *common)
    sweep = json.loads((results / "sweep.json").read_text())
    digits = sweep["tasks"]["digits"]
    assert [p["depth"] for p in digits["per_depth"]] == [1, 2] and digits["needed_depth"] in (1, 2)
    means = {p["depth"]: p["mean"] for p in digits["per_depth"]}
    assert digits["needed_depth"] == min(d for d, m in means.items() if m >= max(means.values()) - 0.01)
    assert len(list((results / "analyses").glob("digits_d0*_s0_*.json"))) == 6 and (results / "depth.png").exists()

    run("score_depth_rules.py", "--results", results, "--min-depth", 2)
    scores = json.loads((results / "rule_scores.json").read_text())
    assert set(RULES) | {"recommend_depth"} <= set(scores["table"])
    assert all(1 <= r["recommended"]["recommend_depth"] <= 2 for r in scores["rows"])

    run("bench_truncate_auto.py", "--depth", 2, "--budget", 2, *common)
    run("bench_truncate_auto.py", "--depth", 2, "--budget", 2, "--guarantee", "--resamples", 1, *common)
    run("bench_truncate_auto.py", "--depth", 2, "--costs", "--latency-rounds", 2, *common)
    evaluation = json.loads((results / "truncate_auto.json").read_text())
    guarantee = evaluation["guarantee"]
    assert {r["variant"] for r in guarantee["rows"]} == {"plain 0.95", "distill 0.95", "plain 0 (point estimate)"}
    assert all(r["exceeded"] == (r["test_drop_points"] > 3.0) and 1 <= r["keep"] <= 2 for r in guarantee["rows"])
    assert {v["cases"] for v in guarantee["summary"]["variants"].values()} == {1}
    assert all(v["search_seconds_median"] > 0 for v in guarantee["summary"]["variants"].values())
    for variant, v in guarantee["summary"]["variants"].items():
        group = [r for r in guarantee["rows"] if r["variant"] == variant]
        assert v["worst_test_drop_points"] == max(r["test_drop_points"] for r in group)
        assert v["cuts"] == sum(r["keep"] < 2 for r in group)
    (auto,) = [r for r in evaluation["rows"] if r["strategy"] == "auto"]
    assert 1 <= auto["keep"] <= 2 and len(auto["candidates"]) <= 2
    qualifying = [c["keep"] for c in auto["candidates"] if c["qualifies"]]
    assert auto["keep"] == (min(qualifying) if qualifying else 2)  # the cheapest qualifying cut, else uncut
    assert all(c["qualifies"] == (c["validation_accuracy"]["healed"] >= auto["uncut_val"] - 0.01)
               for c in auto["candidates"])
    assert {c["blocks"] for c in evaluation["costs"]} >= {2, auto["keep"]}
