"""The commands that fit what a run showed, the last lines of ``isiwatch demo`` and ``isiwatch report``: where the
report is, how to browse the run in TensorBoard and, when the trained model may not need all its blocks, the
``isiwatch truncate`` command that tests cutting them, printed only when it would run on the files that exist."""

from __future__ import annotations

import shlex
from pathlib import Path

from .run_records import RunRecords

#: The accuracy points the suggested ``truncate`` may lose: its default bound, named so the user sees the knob.
MAX_DROP = 1


def _fewer_blocks(records: RunRecords) -> bool:
    """Whether the run saw a reason to try fewer blocks: a ``plateau_onset`` alert, a flat stretch (plateau or slow
    start) in the trained model's analysis, or a recommended depth below the model's."""
    flat = records.analysis is not None and records.analysis.phases is not None
    shallower = records.recommendation is not None and (
        records.recommendation["depth"] < records.recommendation["source_depth"])
    return flat or shallower or any(a["kind"] == "plateau_onset" for a in records.alerts)


def truncate_command(records: RunRecords) -> str | None:
    """``isiwatch truncate`` on the checkpoint and images the run's ``analysis.json`` records, with that analysis
    and ``--max-drop`` `MAX_DROP`, writing beside the run; None when the run saw no reason for it
    (`_fewer_blocks`) or the analysis names no checkpoint or images that exist (a Watch log without
    ``analysis.json``, or files moved since)."""
    if records.analysis is None or not _fewer_blocks(records):
        return None
    info = records.analysis.model_info
    checkpoint, data = info.get("checkpoint"), info.get("data")
    if not (isinstance(checkpoint, str) and Path(checkpoint).exists() and isinstance(data, str)
            and (data == "mnist" or Path(data).exists())):
        return None
    out = records.run_dir / f"truncated-max-drop-{MAX_DROP}{'.pt' if Path(checkpoint).is_file() else ''}"
    return shlex.join(["isiwatch", "truncate", checkpoint, "--data", data, "--analysis",
                       str(records.run_dir / "analysis.json"), "--max-drop", str(MAX_DROP), "--out", str(out)])


def next_steps(records: RunRecords, report: Path) -> list[str]:
    """The closing lines: ``report`` (the written report.html), TensorBoard on the run's folder when it holds
    TensorBoard events, and `truncate_command` when there is one."""
    lines = ["next:", f"  open the report: {report}"]
    if any(records.run_dir.glob("events.out.tfevents.*")):
        lines.append(f"  browse the run's curves: {shlex.join(['tensorboard', '--logdir', str(records.run_dir)])}")
    if (command := truncate_command(records)) is not None:
        lines.append(f"  test a cut within {MAX_DROP} accuracy point of the trained model: {command}")
    return lines
