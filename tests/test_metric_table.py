"""The metric table is the single source of the metric names, the terminal and report tables' column labels, the
report's heat-maps, the Grafana dashboard's metric list and the docs page's table."""

import itertools
import json
import math
from pathlib import Path

import pytest

from isiwatch.cli import report
from isiwatch.cli.deploy import DEPLOYMENT
from isiwatch.measure.analysis import METRICS, Analysis, untracked_reason
from isiwatch.measure.metric_table import (
    HEATMAP_METRICS,
    METRIC_TABLE,
    NEEDS_CLS,
    NEEDS_LABELS,
    NEEDS_RECON,
    grafana_metric_variable,
    metric_table_markdown,
)
from isiwatch.measure.metrics import BLOCK_METRICS
from isiwatch.measure.tables import analysis_rows

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "metrics.md"
DASHBOARD = DEPLOYMENT / "grafana" / "dashboards" / "isiwatch.json"
START, END = "<!-- metric-table -->\n", "\n<!-- /metric-table -->"


def test_metrics_are_the_table_rows_in_report_order():
    assert METRICS == (*BLOCK_METRICS, "probe_cls", "probe_patch_mean", "isi_recon")
    assert len({m.label for m in METRIC_TABLE}) == len(METRIC_TABLE)
    assert HEATMAP_METRICS == ("isi", "token_similarity", "probe_cls", "probe_patch_mean")


@pytest.mark.parametrize("has_cls, probes, with_isi_recon", itertools.product([False, True], repeat=3))
def test_needs_say_when_analyze_reports_a_metric(has_cls, probes, with_isi_recon):
    met = {NEEDS_CLS: has_cls, NEEDS_LABELS: probes, NEEDS_RECON: with_isi_recon}
    for m in METRIC_TABLE:
        reported = untracked_reason(m.name, has_cls, probes, with_isi_recon) is None
        assert reported == all(met[need] for need in m.needs), m.name


def test_the_docs_page_holds_the_rendered_table():
    text = DOCS.read_text(encoding="utf-8")
    table = text[text.index(START) + len(START):text.index(END)]
    assert table == metric_table_markdown(), (
        f"{DOCS}: the table between the metric-table markers is not the metric table; paste "
        "isiwatch.measure.metric_table.metric_table_markdown() there")


def test_terminal_and_report_tables_head_each_metric_with_its_label():
    analysis = Analysis({m: [0.5, 0.25] for m in METRICS}, {}, {"depth": 2})
    header, rows = analysis_rows(analysis)
    assert header == ["layer", *(m.label for m in METRIC_TABLE), "phase"]
    assert header[1:4] == ["d", "h", "isi"] and len(rows) == 2


def test_the_report_draws_the_heatmaps_of_the_table(tmp_path, monkeypatch):
    drawn = {}
    monkeypatch.setattr(report, "plot_heatmaps", lambda steps, grids, path: drawn.setdefault("grids", grids))
    monkeypatch.setattr(report, "plot_plateau_timeline", lambda *args: None)
    samples = [{"step": step, "layers": {m: [0.5, 0.25] for m in METRICS}} for step in (1, 2)]
    report.write_plots(report.RunRecords(tmp_path, samples, [], None, None), tmp_path)
    assert tuple(drawn["grids"]) == HEATMAP_METRICS


def test_the_dashboard_lists_every_metric_of_the_table():
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["metric"] == grafana_metric_variable(), (
        f"{DASHBOARD}: the 'metric' template variable is not the metric table's; replace it with "
        "json.dumps(isiwatch.measure.metric_table.grafana_metric_variable(), indent=2)")
    heatmap = next(p for p in board["panels"] if p["type"] == "heatmap")
    assert heatmap["repeat"] == "metric"


def _assert_texts_inside_and_apart(fig):
    """Every visible text of ``fig`` (titles, axis labels, tick labels, legend, figure title) lies inside the figure,
    and none reaches into the data area of a panel other than its own."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    frame = fig.bbox
    panels = [ax for ax in fig.axes if ax.images or ax.lines]
    owned = [(None, t) for t in fig.texts] + [(None, t) for legend in fig.legends for t in legend.get_texts()]
    for ax in fig.axes:
        owned += [(ax, t) for t in (ax.title, ax.xaxis.label, ax.yaxis.label, *ax.get_xticklabels(),
                                    *ax.get_yticklabels())]
    shown = [(ax, text.get_window_extent(renderer), text.get_text()) for ax, text in owned
             if text.get_visible() and text.get_text()]
    for i, (ax, box, label) in enumerate(shown):  # texts of different panels (or of the figure) never overlap
        for other_ax, other_box, other_label in shown[i + 1:]:
            assert other_ax is ax or not box.overlaps(other_box), (label, other_label)
    for ax, text in owned:
        if not (text.get_visible() and text.get_text()):
            continue
        box = text.get_window_extent(renderer)
        inside = frame.x0 - 1 <= box.x0 and box.x1 <= frame.x1 + 1 and frame.y0 - 1 <= box.y0 <= box.y1 <= frame.y1 + 1
        assert inside, text.get_text()
        for other in panels:
            clear = other is ax or not box.overlaps(other.get_window_extent(renderer))
            assert clear, (text.get_text(), other.get_title())
    return panels


@pytest.mark.parametrize("panels", [1, 2, 5])
def test_heatmap_figures_keep_every_label_inside_the_figure_and_off_their_neighbours(panels):
    """The heat-maps are laid out with fixed margins (no tight_layout pass): titles, axis labels, six-digit step
    ticks and the colour bars' ticks all lie inside the figure, and no panel's text reaches into another panel."""
    from isiwatch.measure.plots import heatmap_figure

    steps = list(range(0, 200_000, 1_000))
    grids = {f"metric_{i}": [[0.0125 * (s % 7) + i for _ in range(12)] for s in range(len(steps))]
             for i in range(panels)}
    assert len(_assert_texts_inside_and_apart(heatmap_figure(steps, grids))) == panels


def test_the_curves_keep_every_label_inside_the_figure_and_off_their_neighbours(monkeypatch, tmp_path):
    """The curves too: ten panels with small and signed values, the stem points' two-line tick labels, the phase
    legend below and the figure title above, all inside the figure and apart."""
    from isiwatch.measure import plots
    from isiwatch.measure.phases import Phases

    drawn = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(fig))
    depth = 12
    layers = {m: [(-1) ** b * 0.004 * b for b in range(depth)] for m in METRICS[:10]}
    stem = {p: {m: 0.125 for m in layers} for p in ("pre_pe", "embed")}
    analysis = Analysis(layers=layers, stem=stem, model_info={"depth": depth}, phase_metric=next(iter(layers)),
                        phases=Phases(plateau=(3, 5), cliff=(0, 2), climb=(6, 11)))
    plots.plot_curves(analysis, tmp_path / "curves.png")
    assert len(_assert_texts_inside_and_apart(drawn[0])) == 10


def test_heatmap_panels_drawn_on_one_figure_equal_each_metric_drawn_alone():
    """The exporter draws every metric's panel of every render on one figure updated in place: each image equals
    the panel built for that metric alone, colour scale, extent and title included (metrics of different ranges and
    depths; a second render over more steps on the figure the first one left)."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from isiwatch.measure.plots import HeatmapPanel, heatmap_figure

    def pixels(fig):
        canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
        canvas.draw()
        return np.asarray(canvas.buffer_rgba()).copy()

    panel = HeatmapPanel()
    for samples in (4, 9):
        steps = [100 * (s + 1) for s in range(samples)]
        grids = {"small": [[0.001 * (s + b) for b in range(6)] for s in range(samples)],
                 "large": [[50.0 - 3 * s * b for b in range(6)] for s in range(samples)],
                 "deeper": [[float(b) for b in range(7)] if s else [math.nan] * 7 for s in range(samples)]}
        drawn = {metric: pixels(fig) for metric, fig in panel.draw(steps, grids)}
        assert list(drawn) == list(grids)
        for metric, rows in grids.items():
            assert np.array_equal(drawn[metric], pixels(heatmap_figure(steps, {metric: rows}))), (samples, metric)
