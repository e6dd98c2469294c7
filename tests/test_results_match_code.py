"""What benchmarks/RESULTS.md states about the demo is what the code does now: the quick demo at seed 0 on one torch
thread is deterministic, so running it again must give the committed record's accuracy, cut and bounds. When the
code changes what the demo does, this fails until the JSON and RESULTS.md are regenerated, by one command:
``python benchmarks/bench_demo.py``."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_demo  # noqa: E402

#: The fields of a run that do not depend on the machine's speed.
OUTCOME = ("held_out_accuracy", "cut", "keep", "depth", "max_drop", "upper_bound_points", "test_drop_points",
           "printed")


@pytest.mark.slow
def test_the_committed_quick_demo_record_is_what_the_demo_does_now():
    committed = json.loads(bench_demo.RESULT.read_text())
    [record] = [r for r in committed["runs"] if (r["mode"], r["seed"], r["threads"]) == ("quick", 0, 1)]
    now = bench_demo.run("quick", 0, 1)
    differ = {k: (record[k], now[k]) for k in OUTCOME
              if (record[k] != pytest.approx(now[k], abs=1e-9) if isinstance(now[k], float) else record[k] != now[k])}
    assert not differ, f"RESULTS.md's demo figures are out of date (committed, now): {differ}; regenerate them"
