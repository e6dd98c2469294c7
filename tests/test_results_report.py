"""benchmarks/RESULTS.md is what benchmarks/report.py renders from the committed JSON, nothing else."""

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import report  # noqa: E402


def test_results_md_equals_the_report_of_the_committed_json():
    assert (ROOT / "benchmarks" / "RESULTS.md").read_text() == report.render(), \
        "benchmarks/RESULTS.md is out of date: run python benchmarks/report.py"


def test_check_mode_fails_on_a_hand_edit(tmp_path):
    edited = tmp_path / "RESULTS.md"
    rendered = report.render()
    figure = re.search(r"\d+\.\d+×", rendered).group()  # the first speed-up on the page, whatever it reads
    edited.write_text(rendered.replace(figure, "99.99×", 1))
    script = [sys.executable, str(ROOT / "benchmarks" / "report.py"), "--check", "--output"]
    failed = subprocess.run([*script, str(edited)], capture_output=True, text=True)
    assert failed.returncode == 1 and "out of date" in failed.stderr
    edited.write_text(report.render())
    assert subprocess.run([*script, str(edited)], capture_output=True).returncode == 0


def test_a_missing_json_leaves_a_hook_naming_the_command(tmp_path):
    text = report.render(tmp_path)
    assert "Not run yet: `python benchmarks/bench_depth.py` writes `benchmarks/results/depth/sweep.json`" in text
    assert "Not run yet: `python benchmarks/bench_watch.py` writes `benchmarks/results/watch/watch.json`" in text
    assert "| digits |" not in text  # no figure without its JSON


def test_sections_render_the_figures_and_the_machine_of_their_json(tmp_path):
    machine = {"cpu": "Test CPU", "usable_cores": 2, "torch_threads": 1, "load_1min": 0.25, "load_1min_end": 0.5,
               "torch": "2.x", "python": "3.x", "device": "cpu"}
    layers = [{"index": i, "isi": 0.01 * (i + 1), "probe_cls": None} for i in range(3)]
    bench = {"name": "demo", "images": 1000, "blocks": 3, "repeats": 5, "plain_ms": 200.0, "metrics_ms": 280.0,
             "analyze_ms": 300.0, "naive_ms": 4000.0, "probe_ours_ms": 10.0, "probe_sklearn_ms": 480.0,
             "probe_ours": {"cls": [0.5, 0.6, 0.7], "patch_mean": [0.4, 0.5, 0.6]},
             "probe_sklearn": {"cls": [0.52, 0.6, 0.73], "patch_mean": [0.4, 0.5, 0.6]},
             "max_token_similarity_diff": 2e-6}
    (tmp_path / "analyze").mkdir()
    (tmp_path / "analyze" / "analyze.json").write_text(json.dumps(
        {"machine": machine, "args": {"repeats": "5"}, "benches": [bench], "analysis": {"layers": layers}}))
    (tmp_path / "watch").mkdir()
    watch = {"machine": machine, "markdown": ["| overhead | 0.8 % |"]}
    (tmp_path / "watch" / "watch.json").write_text(json.dumps(watch))
    text = report.render(tmp_path)
    assert "Test CPU, 2 usable cores, 1 torch threads, load average 0.25 at the start, 0.5 at the end" in text
    assert "280 ms (**1.40×**)" in text and "300 ms (1.50×)" in text and "| 20 ms |" in text
    assert "4,000 ms (20.0×)" in text and "**48× faster**" in text
    assert "cls mean |diff| 1.7 points (max 3.0)" in text
    assert "isi                  0.010 0.020 0.030" in text and "probe_cls            nan nan nan" in text
    assert "| overhead | 0.8 % |" in text


def test_the_watch_section_gives_the_floor_ratios_whole_run_and_rss_of_its_json(tmp_path):
    machine = {"cpu": "Test CPU", "usable_cores": 2, "torch_threads": 1, "load_1min": 1.0, "torch": "2.x",
               "python": "3.x", "device": "cpu"}
    (tmp_path / "watch").mkdir()
    (tmp_path / "watch" / "watch.json").write_text(json.dumps(
        {"machine": machine, "args": {"rounds": "2", "threads": "1", "device": "cpu"}, "markdown": ["| t |"],
         "floor_ratio": 2.0949, "floor_ratio_with_exports": 2.1546, "whole_run_ratio": -0.0202, "watch_start_s": 0.23,
         "watch_close_s": 3.22, "vit_small": {"probe_images": 256, "floor_ratio": 1.2319},
         "rss": {"samples": 2000, "probe_images": 64, "heatmap_every": 10, "history_size": 1000, "growth_mb": 0.8047,
                 "from_sample": 1000, "in_use_growth_mb": -0.3125}}))
    text = report.render(tmp_path)
    assert "Command: `python benchmarks/bench_watch.py --rounds 2 --threads 1 --device cpu`" in text
    assert "digits **2.09×** (2.15× with their exports; goal ≤ 1.3×)" in text
    assert "256 probe images: **1.23×** (goal ≤ 1.1×)" in text and "-2.02 %" in text
    assert "**+0.8 MB** from sample 1,000 to the last" in text
    assert "to the last (C heap in use: -0.3 MB), in a fresh process." in text


def test_the_docs_quote_the_truncate_speedups_at_batch_64_and_batch_1():
    data = json.loads((ROOT / "benchmarks" / "results" / "truncate_auto" / "truncate_auto.json").read_text())
    speed = report.truncate_speedups(data)
    page = (ROOT / "docs" / "benchmarks.md").read_text()  # the benchmark summary moved there from the README
    pair = " / ".join(f"{speed[t]['b64']:.2f}×" for t in speed), " / ".join(f"{speed[t]['b1']:.2f}×" for t in speed)
    assert f"batch 64: {pair[0]}; batch 1: {pair[1]}" in page


def test_the_truncate_memory_section_renders_its_runs_and_the_goal(tmp_path):
    machine = {"cpu": "Test CPU", "usable_cores": 2, "torch_threads": None, "load_1min": 1.0, "torch": "2.x",
               "python": "3.x", "device": "cpu"}
    runs = [{"images": 2000, "validation_images": 200, "process_mb": 1000.0, "tree_mb": 2000.0},
            {"images": 20000, "validation_images": 2000, "process_mb": 1050.0, "tree_mb": 2300.0}]
    (tmp_path / "truncate_memory").mkdir()
    (tmp_path / "truncate_memory" / "truncate_memory.json").write_text(json.dumps(
        {"machine": machine, "workers": 2, "goal": 0.1, "command": "isiwatch truncate CKPT", "runs": runs,
         "growth": {"process_mb": 0.05, "tree_mb": 0.15}, "within_goal": False}))
    text = report.render(tmp_path)
    assert "| 20,000 | 2,000 | 1050 MB | 2300 MB |" in text
    assert "**+5.0 %** (process) and **+15.0 %** (with workers): outside the goal of 10 %" in text
