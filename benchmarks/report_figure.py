"""The report picture of the docs site: ``isiwatch demo`` (its seed, 0) run once, its report's depth × step heat-maps
(ISI, token similarity and the two probes over training, ``report/heatmaps.png``) copied to
``results/demo/report_heatmaps.png``, which ``docs/hooks.py`` puts into the site.

    python benchmarks/report_figure.py           # the full demo, as the README runs it
    python benchmarks/report_figure.py --quick --out /tmp/heatmaps.png   # does it run
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FIGURE = Path(__file__).parent / "results" / "demo" / "report_heatmaps.png"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the quick demo (a smaller model)")
    parser.add_argument("--out", type=Path, default=FIGURE)
    args = parser.parse_args()
    if args.quick and args.out == FIGURE:
        parser.error("the site shows the full demo's report: give --out elsewhere with --quick")
    with tempfile.TemporaryDirectory() as folder:
        run = Path(folder) / "run"
        subprocess.run([sys.executable, "-m", "isiwatch.cli", "demo", "--out", str(run), "--prometheus-port", "0",
                        "--no-progress", *(["--quick"] if args.quick else [])], check=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(run / "report" / "heatmaps.png", args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
