"""Start-up cost: ``isiwatch --help`` against a bare interpreter and ``import isiwatch`` against ``import torch``.

``import isiwatch`` alone imports nothing heavy (names load on first use), so the comparison with ``import torch``
uses ``import isiwatch; isiwatch.Watch``: the package with its public API loaded, torch included. ``truncate``'s
imports (its modules and Lightning Fabric, which it heals and evaluates on) are timed against ``import torch`` too:
with ``lightning`` installed beside it, importing Fabric also imports torchmetrics (Fabric probes its version),
scipy.signal and transformers; the base install's standalone ``lightning-fabric`` does not.

Each command runs in a fresh interpreter, in rotation (so machine noise hits all alike), and the median wall
time of ``--repeats`` runs is reported with the two differences the performance goals name.

    python benchmarks/bench_startup.py [--repeats 9] [--python VENV/bin/python --name base]

``--python`` times another environment's interpreter and its ``isiwatch`` script (a fresh venv with the wheel and
its base dependencies, as a user installs it); ``--name`` names the JSON (``startup_NAME.json``).
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

RESULTS = Path(__file__).parent / "results" / "startup"
#: What ``isiwatch truncate`` imports before its work: its own modules and the Fabric it heals and evaluates on.
TRUNCATE_IMPORTS = "import isiwatch.truncation.truncate, isiwatch.io.timm_data, lightning_fabric"
#: The environment a run timed: which Fabric distribution, and whether torchmetrics sits beside it.
ENVIRONMENT = ("import importlib.metadata as m, json\n"
               "def version(name):\n"
               "    try:\n        return m.version(name)\n    except m.PackageNotFoundError:\n        return None\n"
               "print(json.dumps({n: version(n) for n in ('lightning-fabric', 'lightning', 'torchmetrics', "
               "'transformers')}))")


def commands(python: str) -> dict[str, list[str]]:
    script = Path(python).with_name("isiwatch")
    return {
        "bare interpreter": [python, "-c", "pass"],
        "import torch": [python, "-c", "import torch"],
        "import isiwatch": [python, "-c", "import isiwatch"],
        "import isiwatch + Watch": [python, "-c", "import isiwatch; isiwatch.Watch"],
        "truncate's imports": [python, "-c", TRUNCATE_IMPORTS],
        "isiwatch --help": [str(script) if script.exists() else shutil.which("isiwatch") or "isiwatch", "--help"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--python", default=sys.executable, help="Interpreter of the environment to time.")
    parser.add_argument("--name", default="", help="Suffix of the JSON's name (startup_NAME.json).")
    args = parser.parse_args()
    timed = commands(args.python)
    environment = json.loads(subprocess.run([args.python, "-c", ENVIRONMENT], check=True, capture_output=True,
                                            text=True).stdout)
    times: dict[str, list[float]] = {name: [] for name in timed}
    for _ in range(args.repeats):
        for name, command in timed.items():
            start = time.perf_counter()
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(t) for name, t in times.items()}
    result = {"repeats": args.repeats, "median_s": median,
              "help_minus_bare_s": median["isiwatch --help"] - median["bare interpreter"],
              "import_isiwatch_minus_torch_s": median["import isiwatch + Watch"] - median["import torch"],
              "truncate_imports_minus_torch_s": median["truncate's imports"] - median["import torch"],
              "environment": {"name": args.name or "dev", "packages": environment},
              "machine": machine(threads=None)}
    for name, value in median.items():
        print(f"{name:26s} {value:.3f} s")
    print(f"--help − bare interpreter: {result['help_minus_bare_s']:.3f} s (goal ≤ 1 s); "
          f"import isiwatch + Watch − import torch: {result['import_isiwatch_minus_torch_s']:.3f} s (goal ≤ 0.5 s)")
    print(f"truncate's imports − import torch: {result['truncate_imports_minus_torch_s']:.3f} s")
    path = RESULTS / f"startup{'_' + args.name if args.name else ''}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
