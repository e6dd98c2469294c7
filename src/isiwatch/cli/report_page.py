"""The HTML page of ``isiwatch report``: one self-contained file (plots embedded, no external files) that explains
itself: every column, state word and alert kind it shows is defined under the table that uses it."""

from __future__ import annotations

import html
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._utils.html_page import document, table
from ..measure.metric_table import METRIC_TABLE
from ..measure.tables import analysis_rows, recommendation_text
from ..measure.vocabulary import ACTIONS, PHASES, legend, plateau_name
from ..truncation.report_html import truncation_section
from .html_blocks import definitions, figure
from .run_records import RunRecords, depth_recommendation


def _episodes(alerts: list[dict[str, Any]], kind: str) -> str:
    """Every episode of ``kind`` in words: where its record opened it and where its ``*_cleared`` record closed
    it ("step 24 – cleared at step 40; step 56 (open)"), or "none"."""
    parts: list[str] = []
    for alert in alerts:
        if alert["kind"] == kind:
            parts.append(f"step {alert['step']} (open)")
        elif alert["kind"] == f"{kind}_cleared" and parts and parts[-1].endswith("(open)"):
            parts[-1] = parts[-1].replace("(open)", f"– cleared at step {alert['step']}")
    return "; ".join(parts) or "none"


def open_at_the_end(alerts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records that opened an episode no ``<kind>_cleared`` record closed after them (action records, which
    open none, aside), in the order they opened."""
    opened: dict[str, dict[str, Any]] = {}
    for alert in alerts:
        kind = alert["kind"]
        if kind.endswith("_cleared"):
            opened.pop(kind.removesuffix("_cleared"), None)
        elif kind not in ACTIONS:
            opened.pop(kind, None)  # a kind opened again: its latest opening is the one still open
            opened[kind] = alert
    return list(opened.values())


def run_name(records: RunRecords) -> str:
    """The run's name as its records give it (each name once, in order, when the folder holds several runs); the
    folder's name only when no record names one."""
    names = dict.fromkeys(str(r["run"]) for r in [*records.samples, *records.alerts] if r.get("run"))
    return ", ".join(names) or records.run_dir.name


def _summary(records: RunRecords) -> str:
    """The run at a glance: its steps, the flat stretch, the alert episodes and those still open at the end (with
    their messages), both depth recommendations and the validated cut, with the state words defined."""
    first, last = records.samples[0], records.samples[-1]
    ph = last.get("phases")
    span = tuple(ph["plateau"]) if ph else None
    rows: list[list[object]] = [["run", run_name(records)], ["samples", len(records.samples)],
                                ["steps", f"{first['step']} – {last['step']}"],
                                ["flat stretch at the last sample",
                                 f"{plateau_name(span)}, blocks {span[0]}–{span[1]}" if span else "none"],
                                ["plateau_onset alerts", _episodes(records.alerts, "plateau_onset")],
                                ["slow_start alerts", _episodes(records.alerts, "slow_start")]]
    rows += [["open at the end of the run", f"{a['kind']} since step {a['step']}: {a['message']}"]
             for a in open_at_the_end(records.alerts)]
    if (at_last := depth_recommendation(last.get("recommendation"))) is not None:
        rows.append(["recommended depth at the last sample (the Watch's probe images)", recommendation_text(at_last)])
    if records.recommendation is not None:
        rows.append(["recommended depth of the trained model (the analysis images: one pass, no healing)",
                     recommendation_text(records.recommendation)])
    if records.truncation:  # the validated counterpart, reconciled with it in the Truncation section
        kept, depth = len(records.truncation["kept_blocks"]), records.truncation["cost"]["uncut"]["blocks"]
        rows.append(["truncation (validated cut)", f"{kept} of {depth} blocks, {records.truncation['strategy']}"])
    duration = statistics.median(s["duration_s"] for s in records.samples)
    rows.append(["median sample duration (probe pass and metrics)", f"{duration:.3f} s"])
    return table(["", ""], rows) + definitions([*([plateau_name(span)] if span else []), "plateau_onset",
                                                "slow_start", "open", "cleared"])


#: What the report's terms mean: the phases (`isiwatch.measure.vocabulary`) and the stem points of the per-layer
#: table and plots.
TERMS = (
    ("layer", "block index 0…L−1; pre_pe: the patch embeddings before the position embedding; embed: the tokens "
              "entering block 0 (plotted at x = −2 and −1)"),
    ("phase", "the block's place in the phase metric's profile: " + legend(list(PHASES))),
)


def _glossary(columns: Sequence[str]) -> str:
    """A definition list of every column label in ``columns`` (metric labels from the metric table)."""
    terms = dict(TERMS)
    terms.update({m.label: f"{m.name}: {m.description} (range {m.range})" for m in METRIC_TABLE})
    items = "".join(f"<dt>{html.escape(c)}</dt><dd>{html.escape(terms[c])}</dd>" for c in columns if c in terms)
    return f'<dl class="glossary">{items}</dl>'


#: Records in the DOM how many images decoded and the size each is shown at (CSS px, "alt:WxH;..."), so a headless
#: browser can verify the page.
CHECK_SCRIPT = """<script>window.addEventListener('load',function(){var n=0,sizes=[];
for(var i=0;i<document.images.length;i++){var im=document.images[i];if(im.complete&&im.naturalWidth>0)n++;
sizes.push(im.alt+':'+Math.round(im.getBoundingClientRect().width)+'x'+Math.round(im.getBoundingClientRect().height));}
document.body.setAttribute('data-images-loaded',n);document.body.setAttribute('data-image-sizes',sizes.join(';'));
});</script>"""


def _alert_definitions(records: RunRecords) -> str:
    """What each alert kind of the run means, and "cleared" when a record closed an episode."""
    kinds = [a["kind"].removesuffix("_cleared") for a in records.alerts]
    cleared = any(a["kind"].endswith("_cleared") for a in records.alerts)
    return definitions([*kinds, *(["cleared"] if cleared else [])])


def page(records: RunRecords, plots: dict[str, Path]) -> str:
    """The whole page: summary, per-layer curves, heat-maps, plateau timeline, alerts and truncation, with
    ``plots`` (`write_plots`' files) embedded."""
    alerts = [[a["step"], a["kind"], a["severity"], a["message"], a["hint"]] for a in records.alerts]
    title = html.escape(f"isiwatch report: {run_name(records)}")
    parts = [f"<h1>{title}</h1>",
             *(f'<p class="warning">warning: {html.escape(line)}</p>' for line in records.mixed),
             "<h2>Summary</h2>", _summary(records)]
    if records.analysis is not None:  # write_plots drew its curves
        header, rows = analysis_rows(records.analysis)
        parts += ["<h2>Per-layer curves of the trained model</h2>", figure(plots["curves"], "per-layer curves"),
                  table(header, rows), "<h3>Columns</h3>", _glossary(header)]
    parts += ["<h2>Depth × training step</h2>", figure(plots["heatmaps"], "heat-maps"),
              "<h2>Slow start and plateau over training</h2>", figure(plots["plateau"], "plateau timeline"),
              "<h2>Alerts</h2>",
              table(["step", "kind", "severity", "message", "hint"], alerts) + _alert_definitions(records)
              if alerts else "<p>No alerts.</p>"]
    if records.truncation:
        parts += ["<h2>Truncation</h2>", truncation_section(records.truncation)]
    return document(f"isiwatch report: {run_name(records)}", "".join(parts) + CHECK_SCRIPT)

