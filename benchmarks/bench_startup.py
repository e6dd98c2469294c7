"""Start-up cost: ``isiwatch --help`` against a bare interpreter and ``import isiwatch`` against ``import torch``.

``import isiwatch`` alone imports nothing heavy (names load on first use), so the comparison with ``import torch``
uses ``import isiwatch; isiwatch.Watch``: the package with its public API loaded, torch included.

Each command runs in a fresh interpreter, in rotation (so machine noise hits all alike), and the median wall
time of ``--repeats`` runs is reported with the two differences the performance goals name.

    python benchmarks/bench_startup.py [--repeats 9]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from machine import machine

RESULT = Path(__file__).parent / "results" / "startup" / "startup.json"
COMMANDS = {
    "bare interpreter": [sys.executable, "-c", "pass"],
    "import torch": [sys.executable, "-c", "import torch"],
    "import isiwatch": [sys.executable, "-c", "import isiwatch"],
    "import isiwatch + Watch": [sys.executable, "-c", "import isiwatch; isiwatch.Watch"],
    "isiwatch --help": [shutil.which("isiwatch") or "isiwatch", "--help"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.repeats):
        for name, command in COMMANDS.items():
            start = time.perf_counter()
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(t) for name, t in times.items()}
    result = {"repeats": args.repeats, "median_s": median,
              "help_minus_bare_s": median["isiwatch --help"] - median["bare interpreter"],
              "import_isiwatch_minus_torch_s": median["import isiwatch + Watch"] - median["import torch"],
              "machine": machine(threads=None)}
    for name, value in median.items():
        print(f"{name:26s} {value:.3f} s")
    print(f"--help − bare interpreter: {result['help_minus_bare_s']:.3f} s (goal ≤ 1 s); "
          f"import isiwatch + Watch − import torch: {result['import_isiwatch_minus_torch_s']:.3f} s (goal ≤ 0.5 s)")
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
