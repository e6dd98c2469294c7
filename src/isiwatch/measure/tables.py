"""Plain-text tables for the terminal."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .analysis import Analysis
from .metric_table import METRIC_TABLE
from .vocabulary import legend

#: The column label of each metric (the metric table's ``label``).
SHORT_NAMES = {m.name: m.label for m in METRIC_TABLE}


def format_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Right-aligned columns; floats with 3 decimals, NaN as '-'."""
    def cell(v: object) -> str:
        if isinstance(v, float):
            return "-" if not math.isfinite(v) else f"{v:.3f}"
        return str(v)

    body = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in body]
    return "\n".join(lines)


def phase_of(analysis: Analysis, index: int) -> str:
    ph = analysis.phases
    if ph is None:
        return ""
    for name in ("cliff", "plateau", "climb"):
        span = getattr(ph, name)
        if span and span[0] <= index <= span[1]:
            return ph.plateau_name if name == "plateau" else name
    return ""


def analysis_rows(analysis: Analysis) -> tuple[list[str], list[list[Any]]]:
    """Header and rows: one row per block (stem points first) with every metric and the block's phase."""
    metrics = list(analysis.layers)
    header = ["layer", *(SHORT_NAMES.get(m, m) for m in metrics), "phase"]
    rows = [[point, *(analysis.stem[point].get(m, math.nan) for m in metrics), ""]
            for point in ("pre_pe", "embed") if point in analysis.stem]
    rows += [[i, *(analysis.layers[m][i] for m in metrics), phase_of(analysis, i)] for i in range(analysis.depth)]
    return header, rows


def analysis_table(analysis: Analysis) -> str:
    return format_table(*analysis_rows(analysis))


def phases_line(analysis: Analysis) -> str:
    """The phases of the analysis's phase metric, then a line defining each phase word it uses."""
    ph = analysis.phases
    if ph is None:
        return f"phases ({analysis.phase_metric}): no flat stretch (no plateau, no slow start)"
    spans = [(name, span) for name in ("cliff", "plateau", "climb") if (span := getattr(ph, name))]
    words = [ph.plateau_name if name == "plateau" else name for name, _ in spans]
    parts = [f"{word} {span[0]}–{span[1]}" for word, (_, span) in zip(words, spans)]
    return f"phases ({analysis.phase_metric}): " + ", ".join(parts) + "\n  " + legend(words)


def recommendation_text(recommendation: Mapping[str, Any]) -> str:
    """A depth recommendation (``DepthRecommendation.to_dict()``, as analysis.json stores it) in words:
    ``9 of 24 blocks (signal probe_knee; drop blocks 9, 10, ...)``."""
    dropped = recommendation["blocks_to_drop"]
    drop = f"drop blocks {', '.join(map(str, dropped))}" if dropped else "drop no blocks"
    return (f"{recommendation['depth']} of {recommendation['source_depth']} blocks "
            f"(signal {recommendation['signal']}; {drop})")
