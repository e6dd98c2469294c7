"""The metric table is the single source of the metric names, the terminal and report tables' column labels, the
report's heat-maps, the Grafana dashboard's metric list and the docs page's table."""

import itertools
import json
from pathlib import Path

import pytest

from isiwatch.cli import report
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
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "isiwatch.json"
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
