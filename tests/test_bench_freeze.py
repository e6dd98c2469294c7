"""benchmarks/bench_freeze.py end to end on its quick configuration: every arm runs on the same steps, the FLOPs
follow the frozen prefixes, and the JSON renders in RESULTS.md's section."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


@pytest.mark.slow
def test_quick_run_writes_every_arm(tmp_path):
    out = tmp_path / "freeze.json"
    subprocess.run([sys.executable, str(BENCHMARKS / "bench_freeze.py"), "--quick", "--threads", "1", "--out",
                    str(out), "--work", str(tmp_path / "work")], check=True, capture_output=True)
    data = json.loads(out.read_text())
    runs = {r["arm"]: r for r in data["finetune_runs"]}
    assert set(runs) == {"full", "head", "half", "freezeout", "gradnorm", "isiwatch"}
    assert len({r["steps"] for r in runs.values()}) == 1  # the same steps for every arm
    flops = {arm: r["train_flops"] for arm, r in runs.items()}
    assert flops["head"] < flops["half"] < flops["full"] and flops["freezeout"] < flops["full"]
    assert runs["head"]["frozen_at_end"] == 4 and runs["half"]["frozen_at_end"] == 2
    assert runs["isiwatch"]["watch_samples"] > 0 and runs["isiwatch"]["watch_flops"] > 0
    assert data["finetune"]["full"]["flops_ratio"][0] == 1.0 and set(data["versus"]) == {"freezeout", "gradnorm"}
    assert {r["arm"] for r in data["scratch_runs"]} == {"full", "early_stopping", "stop_on_plateau"}
    assert out.with_suffix(".png").stat().st_size > 0

    sys.path.insert(0, str(BENCHMARKS))
    import report

    results = tmp_path / "results"
    (results / "freeze").mkdir(parents=True)
    (results / "freeze" / "freeze.json").write_text(out.read_text())
    text = "\n".join(report.freeze(results))
    assert "| isiwatch |" in text and "| stop_on_plateau |" in text and "Goal" in text


@pytest.mark.slow
def test_constant_schedule_keeps_the_learning_rate_and_skips_the_scratch_part(tmp_path):
    def run(schedule):
        out = tmp_path / f"{schedule}.json"
        subprocess.run([sys.executable, str(BENCHMARKS / "bench_freeze.py"), "--quick", "--threads", "1", "--arms",
                        "full", "--skip-scratch", "--schedule", schedule, "--out", str(out), "--work",
                        str(tmp_path / "work")], check=True, capture_output=True)
        return json.loads(out.read_text())

    cosine, constant = run("cosine"), run("constant")
    assert constant["config"]["schedule"] == "constant" and constant["scratch_runs"] == []
    # the same pre-trained model, batches and steps; only the step size differs, so the weights end elsewhere
    assert constant["finetune_runs"][0]["steps"] == cosine["finetune_runs"][0]["steps"]
    assert constant["finetune_runs"][0]["loss"] != cosine["finetune_runs"][0]["loss"]
    assert "learning rate constant" in constant["markdown"][0] and "From scratch" not in "\n".join(
        constant["markdown"])

    sys.path.insert(0, str(BENCHMARKS))
    import report

    (tmp_path / "results" / "freeze").mkdir(parents=True)
    (tmp_path / "results" / "freeze" / "freeze_constant.json").write_text(json.dumps(constant))
    assert report.FREEZE_CONSTANT in "\n".join(report.freeze_constant(tmp_path / "results"))
