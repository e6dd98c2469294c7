"""A truncation in HTML: the cut ``truncate_report.json`` records, its depth story, and the candidates ``auto``
tested with the rule they were held to, in the terminal's words (`isiwatch.truncation.truncate_report`); the
Truncation section of ``isiwatch report``'s page (`truncation_section`) and, on its own, the page ``truncate``
writes for ``report="PAGE.html"`` (`truncation_page`)."""

from __future__ import annotations

import html
from typing import Any

from .._utils import wording
from .._utils.html_page import document, table
from .._utils.state import is_number as _number
from .explain import depth_story, dropped_line, judged, sequence_line
from .strategies import STRATEGIES
from .truncate_report import (
    REPAIRS,
    choice_cell,
    latency_cell,
    no_cut_line,
    report_rows,
    verdict_line,
)

__all__ = ["truncation_page", "truncation_section"]

#: Columns of the truncation candidates table, with the candidate field each reads (dotted: nested); a column no
#: candidate has (a report written before it existed) is left out.
CANDIDATE_COLUMNS = (("repair", "repair"), ("heal-image bound", "choice"), ("strategy", "strategy"),
                     ("blocks", "keep"), ("kept", "kept_blocks"),
                     ("heal steps", "healing_steps"), ("images", "validation_drop.images"),
                     ("val cut", "validation_accuracy.cut"), ("val repaired", "validation_accuracy.healed"),
                     ("drop", "validation_drop.points"), ("upper bound", "validation_drop.upper_bound_points"),
                     ("params", "parameters"), ("MFLOPs/img", "flops_per_image"), ("latency ms (IQR)", "latency_ms"))
KNOWN_CANDIDATE_FIELDS = {key.split(".")[0] for _, key in CANDIDATE_COLUMNS} | {
    "qualifies", "winner", "resumed", "latency_quartiles_ms", "latency_batch", "bridge"}


def _field(record: dict[str, Any], dotted: str) -> object:
    value: object = record
    for key in dotted.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _runs(blocks: list[int]) -> str:
    """Block indices with each run of three or more consecutive ones as its ends ("0–3, 5, 6, 9–11"): a deep model's
    kept blocks stay a narrow column."""
    runs: list[list[int]] = []
    for block in blocks:
        if runs and block == runs[-1][-1] + 1:
            runs[-1].append(block)
        else:
            runs.append([block])
    return ", ".join(f"{run[0]}–{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)) for run in runs)


def _cell(key: str, value: object) -> object:
    if value is None:
        return "–"
    if isinstance(value, list):
        return _runs(value)
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
        points = wording.points(search["max_drop"])
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
    return (f"<p>{html.escape(_rule_caption(search))}</p>" + (table(header, rows) if rows else "<p>No candidates.</p>")
            + "".join(f"<p>{html.escape(line)}</p>" for line in after))


def truncation_section(report: dict[str, Any]) -> str:
    """The section's HTML for ``report`` (a ``truncate_report.json``); `read_run` renders it once to check the file
    before anything is written."""
    steps = report["healing_steps"]
    figures = judged(report["search"]) if isinstance(report.get("search"), dict) else None
    caption = (f"strategy {report['strategy']}, kept blocks {report['kept_blocks']}, "
               f"{steps} healing step{'' if steps == 1 else 's'}" + (f" ({figures[1]})" if figures else ""))
    parts = [f'<p class="story">{html.escape(line)}</p>' for line in depth_story(report) or []]
    parts += [f"<p>{html.escape(caption)}</p>", table(*report_rows(report))]
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


def truncation_page(report: dict[str, Any]) -> str:
    """A self-contained page of one truncation: `truncation_section` under the source checkpoint's name."""
    source = str(report.get("source", {}).get("checkpoint", ""))
    title = f"isiwatch truncate: {source}" if source else "isiwatch truncate"
    return document(title, f"<h1>{html.escape(title)}</h1>{truncation_section(report)}")
