"""The metric table: one row per per-layer metric, the single source of the metric names and their order, the
terminal table's column labels, the report's heat-maps, the Grafana dashboard's metric list and the docs page's
table (``docs/metrics.md``). Plain data, no torch: the docs and the dashboard render without a model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: What a metric needs besides a ViT, as `MetricInfo.needs` lists it.
NEEDS_CLS = "a [CLS] token"
NEEDS_LABELS = "probe labels"
NEEDS_RECON = "with_isi_recon=True"


@dataclass(frozen=True)
class MetricInfo:
    """Facts about one per-layer metric.

    Args:
        name: The metric's name: the key of ``Analysis.layers`` and the ``metric`` label of the exported series.
        label: Its short column label in the terminal and report tables.
        description: Its definition in one line of Markdown.
        range: The values it takes.
        higher_is_better: True or False when a higher value is better (torchmetrics' fact); None when the metric
            describes the model without ranking it.
        needs: What it needs besides a ViT (`NEEDS_CLS`, `NEEDS_LABELS`, `NEEDS_RECON`).
        heatmap: Whether the run report and the Grafana dashboard show its depth × step heat-map by default.
    """

    name: str
    label: str
    description: str
    range: str
    higher_is_better: bool | None
    needs: tuple[str, ...] = ()
    heatmap: bool = False


#: Every per-layer metric, in report order: the block metrics first, then the probes and the opt-in isi_recon.
METRIC_TABLE = (
    MetricInfo("attn_token_change", "d", "d = mean over images, tokens of 1 − cos(X, Y)", "[0, 2]", None),
    MetricInfo("attn_entropy", "h", "h = mean over images, heads, queries of the entropy of A's rows / ln T",
               "[0, 1]", None),
    MetricInfo("isi", "isi", "d · h (attention form of the Information Scrambling Index)", "[0, 2]", None,
               heatmap=True),
    MetricInfo("token_similarity", "tok_sim",
               "centred mean pairwise cosine of Z's patch tokens within an image (i ≠ j)", "[−1, 1]", None,
               heatmap=True),
    MetricInfo("block_influence", "bi",
               "mean over images, tokens of 1 − cos(X, Z): how much the whole block turns the residual stream "
               "(ShortGPT's block influence; 0 for a block that changes nothing)", "[0, 2]", None),
    MetricInfo("cls_attention_share", "cls_att", "T · mean attention patches pay to [CLS] (1 = uniform)",
               "[0, T]", None, (NEEDS_CLS,)),
    MetricInfo("cls_patch_cos", "cls_cos", "mean cos([CLS], patch) in Z", "[−1, 1]", None, (NEEDS_CLS,)),
    MetricInfo("norm_friction", "friction", "cls_patch_cos on X minus the same on norm1(X)", "[−2, 2]", None,
               (NEEDS_CLS,)),
    MetricInfo("probe_cls", "probe_cls", "held-out accuracy of a multinomial logistic classifier on [CLS] of Z",
               "[0, 1]", True, (NEEDS_CLS, NEEDS_LABELS), heatmap=True),
    MetricInfo("probe_patch_mean", "probe_pm",
               "held-out accuracy of a multinomial logistic classifier on the mean patch token of Z", "[0, 1]",
               True, (NEEDS_LABELS,), heatmap=True),
    MetricInfo("isi_recon", "isi_recon",
               "R²_all − R²_self for recovering E from the layer's patch tokens "
               "(recipe in `src/isiwatch/measure/recon.py`)", "unbounded (> 0: scrambled)", None, (NEEDS_RECON,)),
)
#: The metrics whose depth × step heat-maps the run report draws and the Grafana dashboard selects by default.
HEATMAP_METRICS = tuple(m.name for m in METRIC_TABLE if m.heatmap)


def metric_table_markdown() -> str:
    """The metric table as a Markdown table, the one between the markers of ``docs/metrics.md``."""
    def better(value: bool | None) -> str:
        return "–" if value is None else "yes" if value else "no"

    rows = ["| metric | label | definition | range | higher is better | needs | heat-map |",
            "|---|---|---|---|---|---|---|"]
    rows += [f"| `{m.name}` | {m.label} | {m.description} | {m.range} | {better(m.higher_is_better)} | "
             f"{', '.join(m.needs) or '–'} | {better(m.heatmap)} |" for m in METRIC_TABLE]
    return "\n".join(rows)


def grafana_metric_variable() -> dict[str, Any]:
    """The Grafana dashboard's ``metric`` template variable: every metric to choose from, the heat-map metrics
    selected (the heat-map panel repeats over it)."""
    def option(name: str) -> dict[str, Any]:
        return {"selected": name in HEATMAP_METRICS, "text": name, "value": name}

    return {"name": "metric", "label": "Heat-maps", "type": "custom", "query": ",".join(m.name for m in METRIC_TABLE),
            "multi": True, "includeAll": False, "hide": 0,
            "current": {"selected": True, "text": list(HEATMAP_METRICS), "value": list(HEATMAP_METRICS)},
            "options": [option(m.name) for m in METRIC_TABLE]}
