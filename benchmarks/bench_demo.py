"""Wall time of the README's main job: ``isiwatch demo`` and ``isiwatch demo --quick``, each in a fresh process.

    python benchmarks/bench_demo.py
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from machine import machine

RESULT = Path(__file__).parent / "results" / "demo" / "demo.json"


def main() -> None:
    record = machine(threads=None)
    seconds = {}
    for name, extra in (("demo --quick", ["--quick"]), ("demo", [])):
        out = Path(tempfile.mkdtemp())
        start = time.perf_counter()
        subprocess.run([shutil.which("isiwatch") or "isiwatch", "demo", "--out", str(out / "run"), *extra],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        seconds[name] = time.perf_counter() - start
        shutil.rmtree(out)
        print(f"isiwatch {name}: {seconds[name]:.0f} s")
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps({"seconds": seconds, "machine": record}, indent=1) + "\n")


if __name__ == "__main__":
    main()
