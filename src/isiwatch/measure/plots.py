"""PNG plots of per-layer curves with the Cliff / Plateau / Climb phases shaded."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from .._utils.files import atomic_write
from .analysis import STEM_POINTS, Analysis
from .metric_table import METRIC_TABLE
from .phases import Phases, plateau_name

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.transforms import Bbox

PHASE_COLOURS = {"cliff": "#f4a582", "plateau": "#92c5de", "climb": "#a6dba0"}
#: A flat stretch from block 0 (no Cliff before it): a slow start, not the paper's plateau.
SLOW_START_COLOUR = "#fddbc7"


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


def _panel_margins(fig: Figure, rows: int, cols: int, margin: dict[str, float], bottom_band: float = 0.0,
                   top_band: float = 0.0) -> None:
    """Place ``rows`` × ``cols`` panels so that each has ``margin`` (inches: left, right, bottom, top) around its axes,
    below a ``top_band`` and above a ``bottom_band`` (inches) left to the figure's title and legend. Fixed margins
    rather than ``tight_layout``, which measures every text of the figure first: 60 % of drawing a heat-map panel,
    over a third of drawing the curves."""
    width, height = fig.get_size_inches()
    gap_w, gap_h = margin["left"] + margin["right"], margin["bottom"] + margin["top"]
    axes_w, axes_h = width / cols - gap_w, (height - bottom_band - top_band) / rows - gap_h
    fig.subplots_adjust(left=margin["left"] / width, right=1 - margin["right"] / width,
                        bottom=(bottom_band + margin["bottom"]) / height, top=1 - (top_band + margin["top"]) / height,
                        wspace=gap_w / axes_w, hspace=gap_h / axes_h)


def value_label(metric: str) -> str:
    """What a metric's axis or colour bar shows: its table label and range (``"isi in [0, 2]"``), or its name."""
    info = next((m for m in METRIC_TABLE if m.name == metric), None)
    if info is None:
        return metric
    return f"{info.label} in {info.range}" if info.range.startswith("[") else info.label


#: Margins of each curve panel (inches): the y axis's label and tick labels, the two-line stem tick labels and the
#: x label, the title.
CURVES_MARGIN_IN = {"left": 0.75, "right": 0.1, "bottom": 0.55, "top": 0.3}
#: Bands below and above the curve panels (inches): the legend, the figure title.
CURVES_BANDS_IN = (0.4, 0.3)


def plot_curves(analysis: Analysis, path: str | Path, metrics: list[str] | None = None) -> Path:
    """One panel per metric over block index, the stem points at x = −2 (``pre_pe``: patch embeddings before the
    position embedding) and −1 (``embed``: the tokens entering block 0) labelled on the axis, the phases of the
    phase metric shaded, with one legend for the shading and the markers."""
    from matplotlib.artist import Artist
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    plt = _pyplot()
    metrics = metrics or list(analysis.layers)
    cols = 3
    rows = math.ceil(len(metrics) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.8 * rows + sum(CURVES_BANDS_IN)), squeeze=False)
    _panel_margins(fig, rows, cols, CURVES_MARGIN_IN, *CURVES_BANDS_IN)
    phases = analysis.phases
    spans = {name: span for name in ("cliff", "plateau", "climb") if phases and (span := getattr(phases, name))}
    for ax, metric in zip(axes.flat, metrics):
        values = analysis.layers[metric]
        ax.plot(range(len(values)), values, marker="o", ms=3, color="#2166ac")
        stem = [(i - 2, analysis.stem[p][metric]) for i, p in enumerate(STEM_POINTS)
                if metric in analysis.stem.get(p, {})]
        if stem:
            ax.plot(*zip(*stem), marker="s", ms=3, ls=":", color="#888888")
        for name, span in spans.items():
            ax.axvspan(span[0] - 0.5, span[1] + 0.5, color=_phase_colour(phases, name), alpha=0.35, lw=0)
        ticks = _block_ticks(len(values))
        ax.set_xticks([-2, -1, *ticks], [STEM_POINTS[0], "\n" + STEM_POINTS[1], *map(str, ticks)])  # staggered
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel("block", fontsize=8)
        ax.set_ylabel(value_label(metric), fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(metrics):]:
        ax.axis("off")
    handles: list[Artist] = [Patch(color=_phase_colour(phases, name), alpha=0.35,
                                   label=_phase_label(phases, name, span))
               for name, span in spans.items()]
    handles += [Line2D([], [], marker="o", ms=3, color="#2166ac", label="block output"),
                Line2D([], [], marker="s", ms=3, ls=":", color="#888888",
                       label="before block 0: pre_pe (patch embeddings), embed (block 0's input)")]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    title = f"phases of {analysis.phase_metric}: "
    title += (f"{phases.plateau_name} {phases.plateau[0]}–{phases.plateau[1]}" if phases else "no flat stretch")
    fig.suptitle(title, fontsize=10, y=1 - 0.05 / fig.get_size_inches()[1], va="top")
    return _save(fig, path)


def _block_ticks(depth: int) -> list[int]:
    """Block indices to label: every block up to 12, else every ⌈depth/12⌉-th."""
    return list(range(0, depth, max(1, -(-depth // 12))))


def _phase_colour(phases: Phases | None, name: str) -> str:
    return SLOW_START_COLOUR if phases is not None and name == "plateau" and phases.slow_start else PHASE_COLOURS[name]


def _phase_label(phases: Phases | None, name: str, span: tuple[int, int]) -> str:
    """Legend text of a shaded phase: a plateau from block 0 is a slow start (`isiwatch.measure.phases`)."""
    shown = phases.plateau_name if phases is not None and name == "plateau" else name
    return f"{shown} (blocks {span[0]}–{span[1]})"


#: Size of one heat-map panel (inches; 110 dpi): two side by side fill the report's 1,100 px column.
HEATMAP_PANEL_IN = (5.0, 3.6)
#: Margins of each heat-map panel (inches): the block axis on the left, the colour bar's tick labels and label on the
#: right, the step axis below, the title above.
HEATMAP_MARGIN_IN = {"left": 0.6, "right": 0.85, "bottom": 0.5, "top": 0.3}


def heatmap_figure(steps: Sequence[int], grids: dict[str, Sequence[Sequence[float]]]) -> Figure:
    """Depth × training-step heat-maps as a matplotlib figure, one panel per metric; ``grids[metric]`` is
    (samples, depth), two panels a row. Block 0 at the bottom, colour scaled to each metric's range, NaN left
    blank. The run report saves it (`plot_heatmaps`); the TensorBoard exporter logs each metric's panel as an
    image (`HeatmapPanel`)."""
    import numpy as np
    from matplotlib.figure import Figure  # not pyplot: the training process's backend is left alone
    from matplotlib.ticker import MaxNLocator

    cols = min(2, len(grids))
    n_rows = math.ceil(len(grids) / cols)
    fig = Figure(figsize=(HEATMAP_PANEL_IN[0] * cols, HEATMAP_PANEL_IN[1] * n_rows))
    axes = fig.subplots(n_rows, cols, squeeze=False)
    _panel_margins(fig, n_rows, cols, HEATMAP_MARGIN_IN)
    for ax, (metric, rows) in zip(axes.flat, grids.items()):
        grid = np.asarray(rows, dtype=float).T
        image = ax.imshow(grid, aspect="auto", origin="lower", cmap="viridis", interpolation="nearest",
                          extent=_heatmap_extent(steps, grid.shape[0]))
        bar = fig.colorbar(image, ax=ax, fraction=0.046)
        bar.ax.tick_params(labelsize=8)
        bar.set_label(value_label(metric), fontsize=8)
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel("training step", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(5, integer=True))  # six-digit steps stay apart
        ax.set_ylabel("block", fontsize=8)
        ax.tick_params(labelsize=8)
    for ax in list(axes.flat)[len(grids):]:
        ax.axis("off")
    return fig


def _heatmap_extent(steps: Sequence[int], depth: int) -> tuple[float, float, float, float]:
    """Data extent of a heat-map: the first to the last step across, blocks centred on integers up."""
    first, last = (steps[0], steps[-1]) if steps[0] != steps[-1] else (steps[0] - 0.5, steps[0] + 0.5)
    return first, last, -0.5, depth - 0.5


class HeatmapPanel:
    """One metric's `heatmap_figure` at a time, on one figure kept across calls and updated in place.

    Building a panel cost as much as drawing it, and a figure built per render left about 5,000 objects in
    reference cycles (figure ↔ canvas ↔ the Agg pixel buffer) that only Python's full collection frees, so a
    process's memory grew by megabytes per hundred renders; redrawing one figure leaves none.
    """

    def __init__(self) -> None:
        self._fig: Figure | None = None

    def draw(self, steps: Sequence[int], grids: Mapping[str, Sequence[Sequence[float]]]
             ) -> Iterator[tuple[str, Figure]]:
        """Yield each metric's panel of ``grids`` (samples × depth, at ``steps``) in turn, as the one figure:
        draw or save each before taking the next."""
        import numpy as np

        for metric, rows in grids.items():
            if self._fig is None:
                self._fig = heatmap_figure(steps, {metric: rows})
            else:
                ax = self._fig.axes[0]
                grid = np.asarray(rows, dtype=float).T
                image = ax.images[0]
                image.set_data(grid)
                image.set_extent(_heatmap_extent(steps, grid.shape[0]))
                image.norm.autoscale(np.ma.masked_invalid(grid))  # this metric's range, as a new panel's
                ax.title.set_text(metric)  # in the first panel's style
                self._fig.axes[1].yaxis.label.set_text(value_label(metric))  # its colour bar's
            yield metric, self._fig


def plot_heatmaps(steps: Sequence[int], grids: dict[str, Sequence[Sequence[float]]], path: str | Path) -> Path:
    """`heatmap_figure` as a PNG at ``path``."""
    return _save(heatmap_figure(steps, grids), path)


#: Size of the plateau timeline (inches; 110 dpi) and its margins: the block axis on the left, the step axis below,
#: the title above; the legend gets a band below the step axis.
TIMELINE_IN = (9.0, 3.4)
TIMELINE_MARGIN_IN = {"left": 0.6, "right": 0.15, "bottom": 0.45, "top": 0.3}
#: Legend entries a row, and the height (inches) of one row of the legend band.
TIMELINE_LEGEND_COLUMNS, TIMELINE_LEGEND_ROW_IN = 4, 0.2


def plot_plateau_timeline(steps: Sequence[int], spans: Sequence[tuple[int, int] | None], depth: int,
                          alerts: Sequence[tuple[int, str]], path: str | Path, metric: str) -> Path:
    """The flat stretch (blocks) at each sample across the sample's cell of steps (`sample_edges`: a stretch one
    sample alone saw is one interval wide), a slow start (from block 0) and a plateau after a Cliff in their own
    colours, with alert records as vertical markers: an episode's opening dashed, its ``*_cleared`` record dotted, in
    the kind's colour (the legend below names them). The records of one step share one rotated label, placed where it
    stays inside the frame and off the other labels (`_place_alert_labels`)."""
    from matplotlib.artist import Artist
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=TIMELINE_IN)
    handles: list[Artist] = []
    edges = sample_edges(steps)
    for name, colour in (("slow start", SLOW_START_COLOUR), ("plateau", PHASE_COLOURS["plateau"])):
        shown = [(i, s) for i, s in enumerate(spans) if s and plateau_name(s) == name]
        if shown:  # each sample's span over its own cell of steps: one sample alone is as wide as its interval
            ax.bar([edges[i] for i, _ in shown], [s[1] - s[0] + 1 for _, s in shown],
                   width=[edges[i + 1] - edges[i] for i, _ in shown], bottom=[s[0] - 0.5 for _, s in shown],
                   align="edge", color=colour, alpha=0.8, lw=0, antialiased=False)
            where = " (from block 0, no Cliff)" if name == "slow start" else " (after a Cliff)"
            handles.append(Patch(color=colour, alpha=0.8, label=name + where))
    for step, kind in alerts:
        opened = kind.removesuffix("_cleared")
        ax.axvline(step, color=_alert_colour(opened), ls=":" if opened != kind else "--", lw=1)
    for opened in dict.fromkeys(kind.removesuffix("_cleared") for _, kind in alerts):
        handles.append(Line2D([], [], color=_alert_colour(opened), ls="--", lw=1, label=opened))
    if any(kind.endswith("_cleared") for _, kind in alerts):
        handles.append(Line2D([], [], color="#555555", ls=":", lw=1, label="dotted: the episode cleared"))
    rows = math.ceil(len(handles) / TIMELINE_LEGEND_COLUMNS)
    fig.set_size_inches(TIMELINE_IN[0], TIMELINE_IN[1] + rows * TIMELINE_LEGEND_ROW_IN)
    _panel_margins(fig, 1, 1, TIMELINE_MARGIN_IN, bottom_band=rows * TIMELINE_LEGEND_ROW_IN + 0.05)
    everything = [edges[0], edges[-1], *(step for step, _ in alerts)]
    first, last = min(everything), max(everything)
    pad = 0.01 * (last - first)
    ax.set_xlim(first - pad, last + pad)
    ax.set_ylim(-0.5, depth - 0.5)
    ax.set_xlabel("training step", fontsize=8)
    ax.set_ylabel("block", fontsize=8)
    ax.set_title(f"flat stretch of {metric} over training", fontsize=10)
    ax.tick_params(labelsize=7)
    if handles:
        fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), TIMELINE_LEGEND_COLUMNS), fontsize=7,
                   frameon=False)
    _place_alert_labels(ax, alerts)
    return _save(fig, path)


def sample_edges(steps: Sequence[int]) -> list[float]:
    """Where each sample's cell of steps begins and ends (one more value than ``steps``): halfway to the neighbouring
    samples, and half an interval past the first and the last (a whole step around a single sample)."""
    if len(steps) == 1:
        return [steps[0] - 0.5, steps[0] + 0.5]
    halfway = [(a + b) / 2 for a, b in zip(steps, steps[1:])]
    return [2 * steps[0] - halfway[0], *halfway, 2 * steps[-1] - halfway[-1]]


#: A label's backdrop: readable where it crosses another marker or the shading.
LABEL_BACKGROUND = {"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.8}


def _alert_colour(kind: str) -> str:
    return ALERT_COLOURS.get(kind, "#999999")


def _place_alert_labels(ax: Axes, alerts: Sequence[tuple[int, str]]) -> None:
    """One rotated label a step (its records' kinds), at the first place, left or right of the marker, hanging from
    the top or standing on the bottom, where it lies inside the axes and off the labels placed before; a label with
    no such place is left out (its marker's colour and style still name it in the legend)."""
    by_step: dict[int, list[str]] = {}
    for step, kind in alerts:
        by_step.setdefault(step, []).append(kind)
    renderer = ax.figure.canvas.get_renderer()  # type: ignore[attr-defined]  # Agg's, as _pyplot selects
    frame = ax.get_window_extent(renderer)
    placed: list[Bbox] = []
    places = [(y, dx, ha) for y in (1, 0) for dx, ha in ((-2, "right"), (2, "left"))]
    for step, kinds in sorted(by_step.items()):
        for y, dx, ha in places:
            label = ax.annotate(", ".join(dict.fromkeys(kinds)), (step, y), xycoords=("data", "axes fraction"),
                                xytext=(dx, -3 if y else 3), textcoords="offset points", rotation=90, fontsize=7,
                                ha=ha, va="top" if y else "bottom", bbox=LABEL_BACKGROUND)
            box = label.get_window_extent(renderer)
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if inside and not any(box.padded(2).overlaps(other) for other in placed):
                placed.append(box)
                break
            label.remove()


ALERT_COLOURS = {"plateau_onset": "#d6604d", "slow_start": "#f4a582", "isi_stall": "#b2182b",
                 "cls_marginalized": "#762a83", "non_finite": "#000000", "early_stop": "#1b7837"}
