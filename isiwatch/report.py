"""``isiwatch report RUN_DIR``: plots and one self-contained HTML page of a monitored run.

Reads what a Watch with ``log_dir`` writes (``metrics.jsonl``, ``alerts.jsonl``) plus, when present,
``analysis.json`` (the final offline analysis, with its depth recommendation when it was written with one)
and ``truncate_report.json`` (the demo's truncation).
"""

from __future__ import annotations

import base64
import html
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from .analysis import Analysis
from .files import atomic_write
from .plots import plot_curves, plot_heatmaps, plot_plateau_timeline
from .tables import analysis_rows, recommendation_text
from .truncate import report_rows

HEATMAP_METRICS = ("isi", "token_similarity", "probe_cls", "probe_patch_mean")


@dataclass
class RunRecords:
    """Everything a run directory holds."""

    run_dir: Path
    samples: list[dict]
    alerts: list[dict]
    analysis: Analysis | None
    truncation: dict | None
    recommendation: dict | None = None  # analysis.json's depth recommendation (absent in older files)


def _jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                raise ValueError(f"{path}:{number}: not a JSON line") from None
    return records


def read_run(run_dir: str | Path) -> RunRecords:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"{run_dir}: no such run directory")
    samples = _jsonl(run_dir / "metrics.jsonl")
    if not samples:
        raise ValueError(f"{run_dir}: no samples in metrics.jsonl (is this an isiwatch log_dir?)")
    analysis_path, truncate_path = run_dir / "analysis.json", run_dir / "truncate_report.json"
    try:
        data = json.loads(analysis_path.read_text()) if analysis_path.exists() else None
        analysis = Analysis.from_dict(data) if data is not None else None
        truncation = json.loads(truncate_path.read_text()) if truncate_path.exists() else None
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{run_dir}: unreadable analysis.json or truncate_report.json ({exc})") from None
    recommendation = _recommendation(data.get("recommendation")) if data is not None else None
    return RunRecords(run_dir, samples, _jsonl(run_dir / "alerts.jsonl"), analysis, truncation, recommendation)


def _recommendation(value) -> dict | None:
    """A stored depth recommendation, or None when absent or not one."""
    keys = ("depth", "signal", "blocks_to_drop", "source_depth")
    return value if isinstance(value, dict) and all(k in value for k in keys) else None


def _grid(samples: list[dict], metric: str) -> list[list[float]]:
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
    alerts = [(a["step"], a["kind"]) for a in records.alerts if not a["kind"].endswith("_cleared")]
    metric = records.analysis.phase_metric if records.analysis else "token_similarity"
    paths["plateau"] = plot_plateau_timeline(steps, spans, depth, alerts, out / "plateau.png", metric)
    return paths


def _table(header: list[str], rows: list[list]) -> str:
    def cell(v) -> str:
        if isinstance(v, float):
            return "–" if not math.isfinite(v) else f"{v:.3f}"
        return html.escape(str(v))

    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></figure>'


def _summary(records: RunRecords) -> str:
    first, last = records.samples[0], records.samples[-1]
    ph = last.get("phases")
    onset = next((a["step"] for a in records.alerts if a["kind"] == "plateau_onset"), None)
    rows = [["run", last.get("run", "")], ["samples", len(records.samples)],
            ["steps", f"{first['step']} – {last['step']}"],
            ["plateau at the last sample", f"blocks {ph['plateau'][0]}–{ph['plateau'][1]}" if ph else "none"],
            ["plateau onset", f"step {onset}" if onset is not None else "none"]]
    if (at_last := _recommendation(last.get("recommendation"))) is not None:
        rows.append(["recommended depth at the last sample", recommendation_text(at_last)])
    if records.recommendation is not None:
        rows.append(["recommended depth of the trained model", recommendation_text(records.recommendation)])
    rows.append(["median sample cost", f"{statistics.median(s['duration_s'] for s in records.samples):.3f} s"])
    return _table(["", ""], rows)


def _truncation_table(report: dict) -> str:
    caption = (f"strategy {report['strategy']}, kept blocks {report['kept_blocks']}, "
               f"{report['healing_steps']} healing steps")
    return f"<p>{html.escape(caption)}</p>" + _table(*report_rows(report))


STYLE = """body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ddd;padding:2px 8px;text-align:right}
th{background:#f4f4f4}img{max-width:100%;border:1px solid #eee}figure{margin:.8em 0}"""

#: Records in the DOM how many images decoded, so a headless browser can verify the page.
CHECK_SCRIPT = """<script>window.addEventListener('load',function(){var n=0;
for(var i=0;i<document.images.length;i++){if(document.images[i].complete&&document.images[i].naturalWidth>0)n++;}
document.body.setAttribute('data-images-loaded',n);});</script>"""


def write_report(run_dir: str | Path, out: str | Path | None = None) -> list[Path]:
    """Write the plots and ``report.html`` (images embedded, no external files) to ``out``
    (default ``RUN_DIR/report``); returns the written paths."""
    records = read_run(run_dir)
    out = Path(out) if out is not None else records.run_dir / "report"
    plots = write_plots(records, out)
    alerts = [[a["step"], a["kind"], a["severity"], a["message"]] for a in records.alerts]
    parts = [f"<h1>isiwatch report: {html.escape(records.run_dir.name)}</h1>", "<h2>Summary</h2>",
             _summary(records)]
    if "curves" in plots:
        parts += ["<h2>Per-layer curves of the trained model</h2>", _img(plots["curves"], "per-layer curves"),
                  _table(*analysis_rows(records.analysis))]
    parts += ["<h2>Depth × training step</h2>", _img(plots["heatmaps"], "heat-maps"),
              "<h2>Plateau over training</h2>", _img(plots["plateau"], "plateau timeline"),
              "<h2>Alerts</h2>", _table(["step", "kind", "severity", "message"], alerts) if alerts
              else "<p>No alerts.</p>"]
    if records.truncation:
        parts += ["<h2>Truncation</h2>", _truncation_table(records.truncation)]
    page = (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>isiwatch report</title>'
            f"<style>{STYLE}</style></head><body>{''.join(parts)}{CHECK_SCRIPT}</body></html>")
    path = out / "report.html"
    with atomic_write(path) as tmp:
        tmp.write_text(page, encoding="utf-8")
    return [*plots.values(), path]
