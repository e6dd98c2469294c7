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
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from .._utils.files import atomic_files, atomic_write
from ..io.checkpoint import sha256_of
from ..measure.analysis import Analysis
from ..measure.metric_table import HEATMAP_METRICS, METRIC_TABLE
from ..measure.plots import plot_curves, plot_heatmaps, plot_plateau_timeline
from ..measure.tables import analysis_rows, recommendation_text
from ..measure.vocabulary import PHASES, VOCABULARY, legend, plateau_name
from ..truncation.explain import depth_story, dropped_line, judged, sequence_line
from ..truncation.strategies import STRATEGIES
from ..truncation.truncate_report import (
    REPAIRS,
    choice_cell,
    latency_cell,
    no_cut_line,
    report_rows,
    verdict_line,
)


@dataclass
class RunRecords:
    """Everything a run directory holds."""

    run_dir: Path
    samples: list[dict[str, Any]]
    alerts: list[dict[str, Any]]
    analysis: Analysis | None
    truncation: dict[str, Any] | None
    recommendation: dict[str, Any] | None = None  # analysis.json's depth recommendation (absent in older files)
    #: What does not belong together in the folder (several runs, a step logged twice, another run's truncation),
    #: one line each: the terminal warns with them and the page shows them above its summary.
    mixed: list[str] = field(default_factory=list)


Warn = Callable[[str], None]
T = TypeVar("T")


def _python_warning(message: str) -> None:
    warnings.warn(message, RuntimeWarning, stacklevel=5)


def _jsonl(path: Path, warn: Warn) -> list[tuple[int, object]]:
    """(line number, record) of every line. A cut-off last line (no line break after it), what a run killed while
    writing leaves, is skipped with a warning; any other malformed line is an error that says what is wrong."""
    if not path.exists():
        return []
    data = path.read_bytes()
    lines = [(number, line) for number, line in enumerate(data.split(b"\n"), 1) if line.strip()]
    torn = lines[-1][0] if lines and not data.endswith(b"\n") else None  # the last line, when it has no line break
    records = []
    for number, line in lines:
        try:
            records.append((number, json.loads(line)))
        except ValueError as exc:  # JSONDecodeError, or UnicodeDecodeError (a torn line may end mid-character)
            if number == torn:
                warn(f"{path}:{number}: skipped the cut-off last line (the run stopped while writing it)")
            elif isinstance(exc, UnicodeDecodeError):
                raise ValueError(f"{path}:{number}: not UTF-8 (byte {exc.start + 1} of the line)") from None
            else:
                raise ValueError(f"{path}:{number}: not a JSON line") from None
    return records


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _sample_problem(record: dict[str, Any]) -> str | None:
    """What keeps a metrics.jsonl record from being reported, or None."""
    for key in ("step", "duration_s"):
        if not _number(record.get(key)):
            return f"{key!r} is missing or not a number"
    layers = record.get("layers") or {}
    if not isinstance(layers, dict):
        return "'layers' is not an object"
    for metric, values in layers.items():
        if not isinstance(values, list) or not all(v is None or _number(v) for v in values):
            return f"'layers.{metric}' is not a list of numbers"
    if len({len(values) for values in layers.values()}) > 1:
        return "the 'layers' lists differ in length"
    phases = record.get("phases")
    plateau = phases.get("plateau") if isinstance(phases, dict) else None
    if phases is not None and not (isinstance(plateau, list) and len(plateau) == 2 and all(map(_number, plateau))):
        return "'phases' has no plateau span"
    return None


def _alert_problem(record: dict[str, Any]) -> str | None:
    """What keeps an alerts.jsonl record from being reported, or None."""
    if not _number(record.get("step")):
        return "'step' is missing or not a number"
    missing = [key for key in ("kind", "severity", "message") if not isinstance(record.get(key), str)]
    return f"{missing[0]!r} is missing or not a string" if missing else None


def _records(path: Path, warn: Warn, problem: Callable[[dict[str, Any]], str | None]) -> list[dict[str, Any]]:
    records = []
    for number, record in _jsonl(path, warn):
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: not a JSON object")
        if (found := problem(record)) is not None:
            raise ValueError(f"{path}:{number}: {found}")
        records.append(record)
    return records


def _reason(exc: Exception) -> str:
    if isinstance(exc, KeyError):
        return f"missing {exc.args[0]!r}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _json_file(path: Path, what: str, check: Callable[[Any], T]) -> T | None:
    """``check(data)`` of the JSON file at ``path`` (None when there is none); any failure names the file."""
    if not path.exists():
        return None
    try:
        return check(json.loads(path.read_bytes()))
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise ValueError(f"{path}: not {what} ({_reason(exc)})") from None


def _analysis(data: dict[str, Any]) -> tuple[Analysis, dict[str, Any] | None]:
    analysis = Analysis.from_dict(data)
    analysis_rows(analysis)  # fails here, before anything is written, when the curves do not line up
    return analysis, _recommendation(data.get("recommendation"))


def _truncation(data: dict[str, Any]) -> dict[str, Any]:
    if data:
        _truncation_table(data)
    return data


def read_run(run_dir: str | Path, warn: Warn | None = None) -> RunRecords:
    """Read and check everything `write_report` uses; a problem raises ValueError naming the file (and
    line). ``warn`` receives one-line notes (default: a Python warning)."""
    run_dir = Path(run_dir)
    warn = warn or _python_warning
    if not run_dir.is_dir():
        raise ValueError(f"{run_dir}: no such run directory")
    samples = _records(run_dir / "metrics.jsonl", warn, _sample_problem)
    if not any(s.get("layers") for s in samples):
        raise ValueError(f"{run_dir}: no samples in metrics.jsonl (is this an isiwatch log_dir?)")
    alerts = _records(run_dir / "alerts.jsonl", warn, _alert_problem)
    analysis, recommendation = (_json_file(run_dir / "analysis.json", "an isiwatch analysis", _analysis)
                                or (None, None))
    truncation = _json_file(run_dir / "truncate_report.json", "an isiwatch truncation report", _truncation)
    mixed = [*_mixed_runs(run_dir / "metrics.jsonl", samples),
             *_foreign_truncation(run_dir, analysis, truncation),
             *_older_than_the_log(run_dir, samples, [n for n, d in (("analysis.json", analysis),
                                                                    ("truncate_report.json", truncation)) if d])]
    for line in mixed:
        warn(line)
    return RunRecords(run_dir, samples, alerts, analysis, truncation, recommendation, mixed)


def _mixed_runs(path: Path, samples: list[dict[str, Any]]) -> list[str]:
    """Lines on several runs in one log, and on steps a run logged more than once (two Watches that shared the
    folder, or a resume whose stale records stayed)."""
    steps: dict[str, list[int]] = {}
    for sample in samples:
        steps.setdefault(str(sample.get("run", "")), []).append(sample["step"])
    lines = []
    if len(steps) > 1:
        lines.append(f"{path} holds {len(steps)} runs ({', '.join(map(repr, steps))}): the report shows them "
                     "together; give each run its own log_dir")
    for run, logged in steps.items():
        twice = sorted({step for step in logged if logged.count(step) > 1})
        if twice:
            shown = ", ".join(map(str, twice[:5])) + (", ..." if len(twice) > 5 else "")
            lines.append(f"{path}: run {run!r} logged step{'s' * (len(twice) > 1)} {shown} more than once")
    return lines


def _foreign_truncation(run_dir: Path, analysis: Analysis | None, truncation: dict[str, Any] | None) -> list[str]:
    """A line when ``truncate_report.json`` cut another model than this run's: its source's sha256 differs from the
    analysed checkpoint's, or from the checkpoint file it names when that file is in the folder."""
    if not truncation:
        return []
    source = truncation.get("source", {})
    analysed = analysis.model_info.get("sha256") if analysis is not None else None
    named = Path(str(source.get("checkpoint", "")))
    here = source.get("checkpoint") and named.is_file() and named.resolve().parent == run_dir.resolve()
    now = sha256_of(named) if here else None  # the checkpoint it cut is this folder's: is it still that file?
    for other, what in ((analysed, "the checkpoint analysis.json analysed"), (now, f"{named} as it is now")):
        if source.get("sha256") and other and source["sha256"] != other:
            return [f"{run_dir / 'truncate_report.json'} cut another model than {what} (sha256 differs): it "
                    "belongs to another run"]
    return []


def _older_than_the_log(run_dir: Path, samples: list[dict[str, Any]], names: list[str]) -> list[str]:
    """A line for each of ``names`` last written before the log's first sample (file time against the samples'
    ``time``, both seconds since the epoch): a run's analysis and truncation come after its training, so such a file
    is an earlier run's (a demo or training re-run into the folder that did not get as far)."""
    times = [t for t in (s.get("time") for s in samples) if isinstance(t, (int, float))]
    if not times:
        return []
    first = min(times)
    return [f"{run_dir / name} was written before the first sample in metrics.jsonl: it belongs to an earlier run, "
            "not to this log" for name in names if (run_dir / name).stat().st_mtime < first]


def _recommendation(value: object) -> dict[str, Any] | None:
    """A stored depth recommendation, or None when absent or not one."""
    keys = ("depth", "signal", "blocks_to_drop", "source_depth")
    return value if isinstance(value, dict) and all(k in value for k in keys) else None


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


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def cell(v: object) -> str:
        if isinstance(v, float):
            return "–" if not math.isfinite(v) else f"{v:.3f}"
        return html.escape(str(v))

    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></figure>'


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


def _summary(records: RunRecords) -> str:
    first, last = records.samples[0], records.samples[-1]
    ph = last.get("phases")
    span = tuple(ph["plateau"]) if ph else None
    rows = [["run", last.get("run", "")], ["samples", len(records.samples)],
            ["steps", f"{first['step']} – {last['step']}"],
            ["flat stretch at the last sample",
             f"{plateau_name(span)}, blocks {span[0]}–{span[1]}" if span else "none"],
            ["plateau_onset alerts", _episodes(records.alerts, "plateau_onset")],
            ["slow_start alerts", _episodes(records.alerts, "slow_start")]]
    if (at_last := _recommendation(last.get("recommendation"))) is not None:
        rows.append(["recommended depth at the last sample (the Watch's probe images)", recommendation_text(at_last)])
    if records.recommendation is not None:
        rows.append(["recommended depth of the trained model (the analysis images: one pass, no healing)",
                     recommendation_text(records.recommendation)])
    if records.truncation:  # the validated counterpart, reconciled with it in the Truncation section
        kept, depth = len(records.truncation["kept_blocks"]), records.truncation["cost"]["uncut"]["blocks"]
        rows.append(["truncation (validated cut)", f"{kept} of {depth} blocks, {records.truncation['strategy']}"])
    rows.append(["median sample cost", f"{statistics.median(s['duration_s'] for s in records.samples):.3f} s"])
    return _table(["", ""], rows) + _definitions([*([plateau_name(span)] if span else []), "plateau_onset",
                                                  "slow_start", "open", "cleared"])


def _definitions(words: Sequence[str]) -> str:
    """A definition list of the state words ``words`` (`isiwatch.measure.vocabulary`), under the table that uses
    them; a word the table does not know (an alert kind of another version) is left out."""
    items = "".join(f"<dt>{html.escape(w)}</dt><dd>{html.escape(VOCABULARY[w])}</dd>"
                    for w in dict.fromkeys(words) if w in VOCABULARY)
    return f'<dl class="glossary">{items}</dl>'


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


#: Columns of the truncation candidates table, with the candidate field each reads (dotted: nested); a column no
#: candidate has (a report written before it existed) is left out.
CANDIDATE_COLUMNS = (("repair", "repair"), ("heal-image bound", "choice"), ("strategy", "strategy"),
                     ("blocks", "keep"), ("kept", "kept_blocks"),
                     ("heal steps", "healing_steps"), ("images", "validation_drop.images"),
                     ("val cut", "validation_accuracy.cut"), ("val repaired", "validation_accuracy.healed"),
                     ("drop", "validation_drop.points"), ("upper bound", "validation_drop.upper_bound_points"),
                     ("params", "parameters"), ("MFLOPs/img", "flops_per_image"), ("latency ms (IQR)", "latency_ms"))
KNOWN_CANDIDATE_FIELDS = {key.split(".")[0] for _, key in CANDIDATE_COLUMNS} | {
    "qualifies", "winner", "resumed", "latency_quartiles_ms", "latency_batch"}


def _field(record: dict[str, Any], dotted: str) -> object:
    value: object = record
    for key in dotted.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _cell(key: str, value: object) -> object:
    if value is None:
        return "–"
    if isinstance(value, list):
        return ",".join(map(str, value))
    if key == "repair":
        return REPAIRS.get(str(value), value)
    if key == "choice" and isinstance(value, dict):
        return choice_cell(value)
    if key == "flops_per_image" and isinstance(value, (int, float)):
        return value / 1e6
    if key.startswith("validation_drop.") and key != "validation_drop.images" and isinstance(value, (int, float)):
        return f"{value:.2f}"
    return value


def _rule_caption(search: dict[str, Any]) -> str:
    """The rule the candidates were held to, worded so that accuracies a few points apart next to "outside the
    bound" read as what they are: the bound on the drop decides, not the observed drop."""
    parts = []
    if _number(search.get("uncut_validation_accuracy")):
        images = search.get("validation_images")
        parts.append("uncut accuracy validation" + (f" n={images}" if images else "")
                     + f" {search['uncut_validation_accuracy']:.3f} (the val columns: the same images)")
    if _number(search.get("max_drop")):
        points = f"{search['max_drop']:g} point{'' if search['max_drop'] == 1 else 's'}"
        confidence = search.get("confidence") or 0
        if confidence:
            method = (search.get("rule") or {}).get("method")
            parts.append(f"a cut qualifies when the upper {100 * confidence:g} % confidence bound of its paired "
                         f"validation drop (the uncut model's accuracy minus the cut's, image by image) is at most "
                         f"{points}" + (f" ({method})" if method else "") + ": the bound decides, not the observed "
                         f"drop, so a cut whose accuracy is within {points} of the uncut model's is still outside "
                         "the bound when too few images tell the two apart")
        else:
            parts.append(f"a cut qualifies when its observed validation drop (a point estimate) is at most {points}")
    parts.append("drop and upper bound in accuracy points; each cut's repair was chosen before the test, on the "
                 "healing images: the least that would qualify with its rates of discordant healing images (the "
                 "heal-image bound, in points)")
    return "; ".join(parts)


def _verdict(report: dict[str, Any]) -> str:
    """The terminal's verdict line; a report written before the fields it reads existed gives its message."""
    try:
        return verdict_line(report)
    except (KeyError, TypeError):
        return str(report["search"].get("message") or "")


def _candidates(report: dict[str, Any]) -> str:
    """The cuts ``auto`` tested, in its one fixed order, each with its repair and what chose it, its validation
    images, drop, upper bound and verdict; the rule above, the verdict below. Fields a report
    lacks are left out; fields this page does not know are shown as they are."""
    search = report["search"]
    candidates = [c for c in search.get("candidates") or [] if isinstance(c, dict)]
    columns = [(label, key) for label, key in CANDIDATE_COLUMNS if any(_field(c, key) is not None for c in candidates)]
    resumed = any(c.get("resumed") for c in candidates)  # a column only when it says something
    extra = sorted({k for c in candidates for k, v in c.items()
                    if k not in KNOWN_CANDIDATE_FIELDS and isinstance(v, (int, float, str, type(None)))})
    extra += ["resumed"] if resumed else []
    header = [label for label, _ in columns] + extra + ["verdict"]
    rows = [[_cell(key, _field(c, key)) for _, key in columns] + [_cell(k, c.get(k)) for k in extra]
            + ["winner" if c.get("winner") else "within the bound" if c.get("qualifies")
               else "outside the bound: the sequence stops"]
            for c in candidates]
    if "latency_ms" in (key for _, key in columns):  # the median with its spread, as the terminal shows it
        at = [key for _, key in columns].index("latency_ms")
        for row, c in zip(rows, candidates, strict=True):
            row[at] = latency_cell(c) if _number(c.get("latency_ms")) else row[at]
    after = [line for line in (sequence_line(report), _verdict(report), no_cut_line(report)) if line]
    return (f"<p>{html.escape(_rule_caption(search))}</p>" + (_table(header, rows) if rows else "<p>No candidates.</p>")
            + "".join(f"<p>{html.escape(line)}</p>" for line in after))


def _truncation_table(report: dict[str, Any]) -> str:
    steps = report["healing_steps"]
    figures = judged(report["search"]) if isinstance(report.get("search"), dict) else None
    caption = (f"strategy {report['strategy']}, kept blocks {report['kept_blocks']}, "
               f"{steps} healing step{'' if steps == 1 else 's'}" + (f" ({figures[1]})" if figures else ""))
    parts = [f'<p class="story">{html.escape(line)}</p>' for line in depth_story(report) or []]
    parts += [f"<p>{html.escape(caption)}</p>", _table(*report_rows(report))]
    if (dropped := dropped_line(report)) is not None:
        parts.append(f"<p>{html.escape(dropped)}</p>")
    if isinstance(report.get("search"), dict):
        parts += ["<h3>Candidates</h3>", _candidates(report)]
    strategies = "; ".join(f"{name}: {s.description}" for name, s in STRATEGIES.items())
    held_out = {"test": "the test images, which the search never saw"}.get(str(report.get("evaluated_on")),
                                                                            "the held-out images")
    parts.append(f"<p>Strategies: auto: the cheapest cut within the bound; {html.escape(strategies)}. "
                 "Columns: blocks kept, parameters, forward MFLOPs per image and their ratio to the uncut model's "
                 "(the primary costs), latency per batch (median and interquartile range of interleaved repeats; "
                 "a wall speed-up only when the ranges are apart), accuracy on "
                 f"{html.escape(held_out)} (split and size in its header) and agreement of the top-1 prediction "
                 "with the uncut model; val: validation accuracy.</p>")
    return "".join(parts)


STYLE = """body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ddd;padding:2px 8px;text-align:right}
.warning{background:#fff4dc;border-left:4px solid #d08a00;padding:4px 8px}
th{background:#f4f4f4}img{max-width:100%;border:1px solid #eee}figure{margin:.8em 0}
dl.glossary{display:grid;grid-template-columns:max-content auto;gap:2px 12px}dl.glossary dt{font-weight:600}
dl.glossary dd{margin:0}"""

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
    return _definitions([*kinds, *(["cleared"] if cleared else [])])


def _page(records: RunRecords, plots: dict[str, Path]) -> str:
    alerts = [[a["step"], a["kind"], a["severity"], a["message"]] for a in records.alerts]
    parts = [f"<h1>isiwatch report: {html.escape(records.run_dir.name)}</h1>",
             *(f'<p class="warning">warning: {html.escape(line)}</p>' for line in records.mixed),
             "<h2>Summary</h2>", _summary(records)]
    if records.analysis is not None:  # write_plots drew its curves
        header, rows = analysis_rows(records.analysis)
        parts += ["<h2>Per-layer curves of the trained model</h2>", _img(plots["curves"], "per-layer curves"),
                  _table(header, rows), "<h3>Columns</h3>", _glossary(header)]
    parts += ["<h2>Depth × training step</h2>", _img(plots["heatmaps"], "heat-maps"),
              "<h2>Slow start and plateau over training</h2>", _img(plots["plateau"], "plateau timeline"),
              "<h2>Alerts</h2>", _table(["step", "kind", "severity", "message"], alerts) + _alert_definitions(records)
              if alerts else "<p>No alerts.</p>"]
    if records.truncation:
        parts += ["<h2>Truncation</h2>", _truncation_table(records.truncation)]
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>isiwatch report</title>'
            f"<style>{STYLE}</style></head><body>{''.join(parts)}{CHECK_SCRIPT}</body></html>")


def write_report(run_dir: str | Path, out: str | Path | None = None, warn: Warn | None = None) -> list[Path]:
    """Write the plots and ``report.html`` (images embedded, no external files) to ``out``
    (default ``RUN_DIR/report``); returns the written paths.

    Every input is read and checked first (`read_run`), and the files are staged and moved into ``out``
    together (`atomic_files`): a bad input or a failure on the way writes nothing.
    """
    records = read_run(run_dir, warn)
    out = Path(out) if out is not None else records.run_dir / "report"
    with atomic_files(out, last=("report.html",)) as stage:
        plots = write_plots(records, stage)
        with atomic_write(stage / "report.html") as fh:
            fh.write(_page(records, plots).encode("utf-8"))
    return [*(out / path.name for path in plots.values()), out / "report.html"]
