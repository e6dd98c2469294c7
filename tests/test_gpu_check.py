"""`benchmarks/gpu_check.py --smoke` runs every code path of the GPU check on the CPU and prints one sane JSON line."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "gpu_check.py"


def test_gpu_check_smoke_prints_one_sane_json_line():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--threads", "1"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    plan = out["plan"]
    assert out["smoke"] is True and out["device"] == "cpu"

    overhead = out["watch_overhead"]
    assert overhead["samples"] == plan["rounds"] * plan["round_steps"] // plan["every"]
    assert overhead["ratio"] > 1 and overhead["sample_s"] > 0 and overhead["train_step_s"] > 0
    assert len(overhead["round_s"]["plain"]) == len(overhead["round_s"]["watched"]) == plan["rounds"]

    syncs = out["syncs_per_sample"]  # CUDA only: null with the reason on the CPU
    assert syncs["per_sample"] is None and "CUDA" in syncs["reason"]

    analysis = out["analyze_vs_forward"]
    assert analysis["images"] == plan["analyze_images"]
    assert analysis["ratio"] == analysis["analyze_s"] / analysis["forward_s"] > 1

    latency = out["truncate_latency_ms"]
    assert set(latency) == {str(b) for b in plan["latency_batches"]}
    assert all(set(ms) == {"12", "8", "6"} and min(ms.values()) > 0 for ms in latency.values())

    compiled = out["watch_compile"]
    assert compiled["ok"] and compiled["unique_graphs"] == 1 and compiled["samples"] >= 1
    in_autocast = out["watch_in_autocast"]  # step() inside bf16 autocast: every sample, no failure
    assert in_autocast["ok"] and in_autocast["samples"] == in_autocast["steps"] // in_autocast["every"] >= 1
    assert set(out["section_s"]) == {"watch_overhead", "syncs_per_sample", "analyze_vs_forward",
                                     "truncate_latency_ms", "watch_compile", "watch_in_autocast"}
