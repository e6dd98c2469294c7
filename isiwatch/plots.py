"""PNG plots of per-layer curves with the Cliff / Plateau / Climb phases shaded."""

from __future__ import annotations

import math
from pathlib import Path

from .analysis import Analysis
from .files import atomic_write

PHASE_COLOURS = {"cliff": "#f4a582", "plateau": "#92c5de", "climb": "#a6dba0"}


def plot_curves(analysis: Analysis, path: str | Path, metrics: list[str] | None = None) -> Path:
    """One panel per metric over block index (stem points at −2/−1), phases of the phase metric shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    path = Path(path)
    with atomic_write(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return path
