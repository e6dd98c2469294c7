"""The phase curve the demo shows a user: ``isiwatch demo`` and ``isiwatch demo --quick`` run for real (seed 0, one
torch thread, no Prometheus endpoint), and the ``token_similarity`` curve of each — the trained model's analysis on
the 1,000 held-out digits, and every Watch sample's — kept with the phases the run printed.

    python benchmarks/demo_curves.py                  # both modes, a few minutes each
    python benchmarks/demo_curves.py --modes quick

Writes ``results/demo/curves.json``; ``tests/test_phases.py`` checks the phase detector against these curves (a
curve a straight line fits within its noise has no Cliff), so the test reads what a user's demo measured instead of
a curve made up to look like it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from machine import machine

from isiwatch._utils.files import write_json
from isiwatch.cli import demo

RESULT = Path(__file__).parent / "results" / "demo" / "curves.json"
METRIC = "token_similarity"


def run(mode: str) -> dict[str, Any]:
    """One demo of ``mode`` ("quick" or "full"): the analysis curve, every Watch sample's curve, what was printed."""
    printed: list[str] = []
    with tempfile.TemporaryDirectory() as folder:
        summary = demo.run_demo(folder, quick=mode == "quick", prometheus_port=None, progress=False,
                                echo=printed.append)
        samples = [json.loads(line) for line in (Path(folder) / "metrics.jsonl").read_text().splitlines()]
    analysis = summary["analysis"]
    return {"mode": mode, "seed": 0, "depth": len(analysis.curve(METRIC)), "metric": METRIC,
            "held_out_accuracy": summary["accuracy"], "analysis_curve": analysis.curve(METRIC),
            "printed_phases": next(line for line in printed if line.startswith("phases (")).split("\n")[0],
            "samples": [{"step": s["step"], "curve": s["layers"][METRIC]} for s in samples if METRIC in s["layers"]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", choices=("quick", "full"), default=["quick", "full"])
    parser.add_argument("--out", type=Path, default=RESULT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    runs = [run(mode) for mode in args.modes]
    write_json(args.out, {"command": "python benchmarks/demo_curves.py", "runs": runs, "machine": machine(1)})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
