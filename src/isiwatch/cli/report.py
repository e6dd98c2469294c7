"""``isiwatch report RUN_DIR``: plots and one self-contained HTML page of a monitored run.

The run's folder is read and checked by `isiwatch.cli.run_records` (`read_run`, `RunRecords`), the page is built by
`isiwatch.cli.report_page`; this module draws the plots and writes the files.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .._utils.files import atomic_files, atomic_write
from ..measure.metric_table import HEATMAP_METRICS
from ..measure.plots import plot_curves, plot_heatmaps, plot_plateau_timeline
from .report_page import page
from .run_records import RunRecords, Warn, read_run

__all__ = ["RunRecords", "Warn", "read_run", "write_plots", "write_records_report", "write_report"]


def _grid(samples: list[dict[str, Any]], metric: str) -> list[list[float]]:
    return [[math.nan if v is None else v for v in s["layers"][metric]] for s in samples]


def write_plots(records: RunRecords, out: Path) -> dict[str, Path]:
    """curves.png (final per-layer curves, phases shaded), heatmaps.png and plateau.png."""
    samples = [s for s in records.samples if s.get("layers")]
    depth = len(next(iter(samples[-1]["layers"].values())))
    samples = [s for s in samples if len(next(iter(s["layers"].values()))) == depth]
    steps = [s["step"] for s in samples]
    paths = {}
    if records.analysis is not None:
        paths["curves"] = plot_curves(records.analysis, out / "curves.png")
    metrics = [m for m in HEATMAP_METRICS if m in samples[-1]["layers"]]
    paths["heatmaps"] = plot_heatmaps(steps, {m: _grid(samples, m) for m in metrics}, out / "heatmaps.png")
    spans = [tuple(s["phases"]["plateau"]) if s.get("phases") else None for s in samples]
    alerts = [(a["step"], a["kind"]) for a in records.alerts]
    metric = records.analysis.phase_metric if records.analysis else "token_similarity"
    paths["plateau"] = plot_plateau_timeline(steps, spans, depth, alerts, out / "plateau.png", metric)
    return paths


def write_report(run_dir: str | Path, out: str | Path | None = None, warn: Warn | None = None) -> list[Path]:
    """Write the plots and ``report.html`` (images embedded, no external files) to ``out``
    (default ``RUN_DIR/report``); returns the written paths.

    Every input is read and checked first (`read_run`), and the files are staged and moved into ``out``
    together (`atomic_files`): a bad input or a failure on the way writes nothing.
    """
    return write_records_report(read_run(run_dir, warn), out)


def write_records_report(records: RunRecords, out: str | Path | None = None) -> list[Path]:
    """`write_report` of a run already read (`read_run`)."""
    out = Path(out) if out is not None else records.run_dir / "report"
    with atomic_files(out, last=("report.html",)) as stage:
        plots = write_plots(records, stage)
        with atomic_write(stage / "report.html") as fh:
            fh.write(page(records, plots).encode("utf-8"))
    return [*(out / path.name for path in plots.values()), out / "report.html"]
