"""The README's main job, ``isiwatch demo`` and ``isiwatch demo --quick``: for 3 seeds × 1 and 2 torch threads,
each run in a fresh process, its wall time and where it went (start-up, data, training, the Watch's samples,
evaluation, analysis, truncate, report), held-out accuracy and whether it printed a cut certified within its bound
(that bound and the cut's test drop).

    python benchmarks/bench_demo.py            # alone on an idle machine: 12 runs; rewrites RESULTS.md too
    python benchmarks/bench_demo.py --smoke --seeds 0 --threads 1 --modes quick --out /tmp/demo.json  # does it run

Writes ``results/demo/demo.json``: one record per run; per mode the slowest run, the lowest held-out accuracy and
whether every run cut within its bound; ``seconds``, the slowest run of each command (the README's figure).
``--smoke`` shrinks both demos to a 2-block model, one epoch and one 2-step candidate: it checks the script, its
records are no figures (and may cut nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import report
from machine import machine

RESULT = Path(__file__).parent / "results" / "demo" / "demo.json"
MODES = {"quick": True, "full": False}

#: Runs one demo in this fresh process and prints its summary as the last line (JSON); "begun": the wall-clock time
#: the demo itself began, after the interpreter's start and the imports.
RUNNER = """
import dataclasses, json, sys, time
from isiwatch._utils.threads import set_torch_threads
from isiwatch.cli import demo, demo_models
threads = set_torch_threads()
if sys.argv[4] == "smoke":
    small = {"depth": 2, "epochs": 1, "cut_budget": 1, "heal_steps": 2}
    demo_models.QUICK, demo_models.FULL = (dataclasses.replace(s, **small)
                                           for s in (demo_models.QUICK, demo_models.FULL))
begun = time.time()
summary = demo.run_demo(sys.argv[1], quick=sys.argv[2] == "quick", seed=int(sys.argv[3]), prometheus_port=None,
                        progress=False)
search, report = summary["truncation"]["search"], summary["truncation"]
winner = search["winner"]
print(json.dumps({"threads": threads, "held_out_accuracy": summary["accuracy"], "cut": winner is not None,
                  "keep": len(report["kept_blocks"]), "depth": report["cost"]["uncut"]["blocks"],
                  "max_drop": search["max_drop"], "confidence": search["confidence"],
                  "upper_bound_points": None if winner is None else  # of the model kept: the one tested
                  winner["validation_drop"]["upper_bound_points"],
                  "test_drop_points": search["test"]["points"], "message": search["message"],
                  "begun": begun, "phase_seconds": summary["phase_seconds"]}))
"""


def run(mode: str, seed: int, threads: int, smoke: bool = False) -> dict[str, Any]:
    """One demo in a fresh process with ``threads`` torch threads: wall time, summary and the printed verdict."""
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        start, launched = time.perf_counter(), time.time()
        done = subprocess.run([sys.executable, "-c", RUNNER, str(Path(folder) / "run"), mode, str(seed),
                               "smoke" if smoke else "real"], env=env, capture_output=True, text=True, check=True)
        seconds = time.perf_counter() - start
    lines = done.stdout.splitlines()
    summary = json.loads(lines[-1])
    printed = next((line for line in lines if line.startswith(("cut to ", "no cut", "no certified cut"))), "")
    # "within its bound": the printed verdict is a cut and its certified bound is within the stated max drop
    within = summary["cut"] and printed.startswith("cut to ") and summary["upper_bound_points"] <= summary["max_drop"]
    phases = {"startup": summary.pop("begun") - launched, **summary.pop("phase_seconds")}  # startup: imports
    phases["other"] = seconds - sum(phases.values())  # closing the Watch, printing, the interpreter's exit
    return {"mode": mode, "seed": seed, "threads": threads, "seconds": seconds, "phase_seconds": phases,
            "printed": printed, "cut_within_bound": within, **summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--out", type=Path, default=RESULT)
    parser.add_argument("--smoke", action="store_true", help="tiny demos that check the script (no figures)")
    args = parser.parse_args()
    if args.smoke and args.out == RESULT:
        parser.error("--smoke records no figures: give --out elsewhere")
    runs = []
    for mode in args.modes:
        for threads in args.threads:
            for seed in args.seeds:
                record = run(mode, seed, threads, args.smoke)
                runs.append(record)
                phases = ", ".join(f"{name} {value:.1f}" for name, value in record["phase_seconds"].items())
                print(f"demo {mode} seed {seed} threads {threads}: {record['seconds']:.0f} s ({phases}), held-out "
                      f"{record['held_out_accuracy']:.3f}, {record['printed']}", flush=True)
    summary = {mode: {"runs": sum(r["mode"] == mode for r in runs),
                      "every_run_cut_within_bound": all(r["cut_within_bound"] for r in runs if r["mode"] == mode),
                      "slowest_seconds": max(r["seconds"] for r in runs if r["mode"] == mode),
                      "lowest_held_out_accuracy": min(r["held_out_accuracy"] for r in runs if r["mode"] == mode),
                      "slowest_run_phase_seconds": max((r for r in runs if r["mode"] == mode),
                                                       key=lambda r: r["seconds"])["phase_seconds"]}
               for mode in args.modes}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # "seconds": the slowest run of each command, the figure the README quotes
    seconds = {("demo --quick" if mode == "quick" else "demo"): summary[mode]["slowest_seconds"] for mode in summary}
    command = " ".join(["python benchmarks/bench_demo.py", *sys.argv[1:]])
    args.out.write_text(json.dumps({"command": command, "seconds": seconds, "summary": summary, "runs": runs,
                                    "machine": machine(threads=None)}, indent=1) + "\n")
    if args.out == RESULT:  # RESULTS.md renders this JSON: one command regenerates both
        report.OUTPUT.write_text(report.render())
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
