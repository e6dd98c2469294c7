"""PNG plots of per-layer curves with the Cliff / Plateau / Climb phases shaded."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from .._utils.files import atomic_write
from .analysis import Analysis

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PHASE_COLOURS = {"cliff": "#f4a582", "plateau": "#92c5de", "climb": "#a6dba0"}


def _pyplot() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    try:
        with atomic_write(path) as fh:
            fig.savefig(fh, format="png", dpi=110)
    finally:
        _pyplot().close(fig)
    return path


def plot_curves(analysis: Analysis, path: str | Path, metrics: list[str] | None = None) -> Path:
    """One panel per metric over block index (stem points at −2/−1), phases of the phase metric shaded."""
    plt = _pyplot()
    metrics = metrics or list(analysis.layers)
    cols = 3
    rows = math.ceil(len(metrics) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.8 * rows), squeeze=False)
    phases = analysis.phases
    for ax, metric in zip(axes.flat, metrics):
        values = analysis.layers[metric]
        ax.plot(range(len(values)), values, marker="o", ms=3, color="#2166ac")
        stem = [(i - 2, analysis.stem[p][metric]) for i, p in enumerate(("pre_pe", "embed"))
                if metric in analysis.stem.get(p, {})]
        if stem:
            ax.plot(*zip(*stem), marker="s", ms=3, ls=":", color="#888888")
        if phases is not None:
            for name in ("cliff", "plateau", "climb"):
                span = getattr(phases, name)
                if span:
                    ax.axvspan(span[0] - 0.5, span[1] + 0.5, color=PHASE_COLOURS[name], alpha=0.35, lw=0)
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel("block", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(metrics):]:
        ax.axis("off")
    title = f"phases of {analysis.phase_metric}: "
    title += (f"plateau {phases.plateau[0]}–{phases.plateau[1]}" if phases else "no plateau")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def heatmap_figure(steps: Sequence[int], grids: dict[str, Sequence[Sequence[float]]]) -> Figure:
    """Depth × training-step heat-maps as a matplotlib figure, one panel per metric; ``grids[metric]`` is
    (samples, depth). Block 0 at the bottom, colour scaled to each metric's range, NaN left blank. The run report
    saves it (:func:`plot_heatmaps`) and the TensorBoard exporter logs it (``SummaryWriter.add_figure``)."""
    import numpy as np
    from matplotlib.figure import Figure  # not pyplot: the training process's backend is left alone

    fig = Figure(figsize=(4.4 * len(grids), 3.4))
    axes = fig.subplots(1, len(grids), squeeze=False)
    first, last = (steps[0], steps[-1]) if steps[0] != steps[-1] else (steps[0] - 0.5, steps[0] + 0.5)
    for ax, (metric, rows) in zip(axes.flat, grids.items()):
        grid = np.asarray(rows, dtype=float).T
        image = ax.imshow(grid, aspect="auto", origin="lower", cmap="viridis", interpolation="nearest",
                          extent=(first, last, -0.5, grid.shape[0] - 0.5))
        fig.colorbar(image, ax=ax, fraction=0.046)
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel("training step", fontsize=8)
        ax.set_ylabel("block", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.tight_layout()
    return fig


def plot_heatmaps(steps: Sequence[int], grids: dict[str, Sequence[Sequence[float]]], path: str | Path) -> Path:
    """:func:`heatmap_figure` as a PNG at ``path``."""
    return _save(heatmap_figure(steps, grids), path)


def plot_plateau_timeline(steps: Sequence[int], spans: Sequence[tuple[int, int] | None], depth: int,
                          alerts: Sequence[tuple[int, str]], path: str | Path, metric: str) -> Path:
    """The plateau span (blocks) at each sample, with alert records as vertical markers."""
    import math

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 3.2))
    lo = [s[0] - 0.5 if s else math.nan for s in spans]
    hi = [s[1] + 0.5 if s else math.nan for s in spans]
    ax.fill_between(steps, lo, hi, step="mid", color=PHASE_COLOURS["plateau"], alpha=0.8, label="plateau")
    colours = {"plateau_onset": "#d6604d", "isi_stall": "#b2182b", "cls_marginalized": "#762a83",
               "non_finite": "#000000", "early_stop": "#1b7837"}
    for step, kind in alerts:
        ax.axvline(step, color=colours.get(kind, "#999999"), ls="--", lw=1)
        ax.annotate(kind, (step, depth - 0.5), rotation=90, fontsize=7, va="top", ha="right")
    ax.set_ylim(-0.5, depth - 0.5)
    ax.set_xlabel("training step", fontsize=8)
    ax.set_ylabel("block", fontsize=8)
    ax.set_title(f"plateau of {metric} over training", fontsize=10)
    ax.tick_params(labelsize=7)
    fig.tight_layout()
    return _save(fig, path)
