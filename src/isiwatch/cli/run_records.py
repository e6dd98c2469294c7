"""Reading a monitored run's folder for ``isiwatch report``: every record checked before anything is written.

Reads what a Watch with ``log_dir`` writes (``metrics.jsonl``, ``alerts.jsonl``) plus, when present,
``analysis.json`` (the final offline analysis, with its depth recommendation when it was written with one)
and ``truncate_report.json`` (the demo's truncation), and names what does not belong together in the folder.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from .._utils.state import is_number
from ..io.checkpoint import sha256_of
from ..measure.analysis import Analysis
from ..measure.tables import analysis_rows
from ..measure.vocabulary import alert_hint
from ..truncation.report_html import truncation_section


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


def _sample_problem(record: dict[str, Any]) -> str | None:
    """What keeps a metrics.jsonl record from being reported, or None."""
    for key in ("step", "duration_s"):
        if not is_number(record.get(key)):
            return f"{key!r} is missing or not a number"
    layers = record.get("layers") or {}
    if not isinstance(layers, dict):
        return "'layers' is not an object"
    for metric, values in layers.items():
        if not isinstance(values, list) or not all(v is None or is_number(v) for v in values):
            return f"'layers.{metric}' is not a list of numbers"
    if len({len(values) for values in layers.values()}) > 1:
        return "the 'layers' lists differ in length"
    phases = record.get("phases")
    plateau = phases.get("plateau") if isinstance(phases, dict) else None
    if phases is not None and not (isinstance(plateau, list) and len(plateau) == 2 and all(map(is_number, plateau))):
        return "'phases' has no plateau span"
    return None


def _alert_problem(record: dict[str, Any]) -> str | None:
    """What keeps an alerts.jsonl record from being reported, or None."""
    if not is_number(record.get("step")):
        return "'step' is missing or not a number"
    missing = [key for key in ("kind", "severity", "message") if not isinstance(record.get(key), str)]
    if missing:
        return f"{missing[0]!r} is missing or not a string"
    return "'hint' is not a string" if not isinstance(record.get("hint", ""), str) else None


def _with_hint(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with its ``hint``: a record written before records had one gets its kind's
    (`isiwatch.measure.vocabulary.alert_hint`)."""
    return {**record, "hint": record.get("hint") or alert_hint(record["kind"], record.get("data"))}


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
    return analysis, depth_recommendation(data.get("recommendation"))


def _truncation(data: dict[str, Any]) -> dict[str, Any]:
    if data:
        truncation_section(data)
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
    alerts = [_with_hint(a) for a in _records(run_dir / "alerts.jsonl", warn, _alert_problem)]
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
                     "together; give each run its own folder (a Watch's default: leave run_folder unset)")
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


def depth_recommendation(value: object) -> dict[str, Any] | None:
    """A stored depth recommendation, or None when absent or not one."""
    keys = ("depth", "signal", "blocks_to_drop", "source_depth")
    return value if isinstance(value, dict) and all(k in value for k in keys) else None
