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

    overhead = out["watch_overhead"]  # a plain copy, a watched one and one with the bf16 probe pass
    assert overhead["train_step_s"] > 0
    assert {name: len(times) for name, times in overhead["round_s"].items()} == {
        "plain": plan["rounds"], "watched": plan["rounds"], "watched_bf16_probe": plan["rounds"]}
    for name, dtype in (("watched", None), ("watched_bf16_probe", "bfloat16")):
        arm = overhead[name]
        assert arm["probe_dtype"] == dtype and arm["samples"] == plan["rounds"] * plan["round_steps"] // plan["every"]
        # the ratio of two short timed runs: its size is the benchmark's to state, never a test's to assert
        assert arm["ratio"] == sum(overhead["round_s"][name]) / sum(overhead["round_s"]["plain"]) > 0
        assert arm["sample_s"] > 0

    cost = out["sample_cost"]  # one sample against a plain forward in the same precision, its parts, its memory
    for dtype in ("float32", "bfloat16"):
        part = cost[dtype]
        assert part["ratio"] == part["sample_s"] / part["forward_s"] > 0
        parts = part["parts_s"]
        assert set(parts) == {"isiwatch.sample", "isiwatch.forward", "isiwatch.metrics", "isiwatch.probes",
                              "isiwatch.host"}
        assert parts["isiwatch.sample"] >= parts["isiwatch.forward"] > parts["isiwatch.metrics"] > 0
        assert part["sample_extra_peak_bytes"] is None and part["forward_extra_peak_bytes"] is None  # CUDA only
    assert "CUDA" in cost["peak_memory_reason"]

    syncs = out["syncs_per_sample"]  # CUDA only: null with the reason on the CPU
    assert syncs["per_sample"] is None and "CUDA" in syncs["reason"]

    analysis = out["analyze_vs_forward"]
    assert analysis["images"] == plan["analyze_images"]
    assert analysis["ratio"] == analysis["analyze_s"] / analysis["forward_s"] > 0

    latency = out["truncate_latency_ms"]
    assert set(latency) == {str(b) for b in plan["latency_batches"]}
    assert all(set(ms) == {"12", "8", "6"} and min(ms.values()) > 0 for ms in latency.values())

    compiled = out["watch_compile"]
    assert compiled["ok"] and compiled["unique_graphs"] == 1 and compiled["samples"] >= 1
    in_autocast = out["watch_in_autocast"]  # step() inside bf16 autocast: every sample, no failure
    assert in_autocast["ok"] and in_autocast["samples"] == in_autocast["steps"] // in_autocast["every"] >= 1
    assert set(out["section_s"]) == {"watch_overhead", "syncs_per_sample", "sample_cost", "analyze_vs_forward",
                                     "truncate_latency_ms", "watch_compile", "watch_in_autocast"}
