"""``metrics.jsonl`` (one line per sample) and ``alerts.jsonl`` (one line per alert record)."""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path
from typing import Any, TextIO

from ..._utils.files import atomic_write, finite_json
from ..alerts import Alert
from ..sample import Sample
from .base import Exporter, SampleContext

logger = logging.getLogger("isiwatch")


class JsonlExporter(Exporter):
    """Appends one JSON object per line and flushes, so a crashed run keeps everything written so far. Every line
    is strict JSON: a NaN or infinite number is written as ``null``. A resume drops the lines the crashed run wrote
    after the checkpoint, so each step of a run has one record (see ``resume``).

    Args:
        log_dir: The folder of ``metrics.jsonl`` and ``alerts.jsonl`` (created if missing, by
            [`open`][isiwatch.Exporter.open] or the first write; existing files are appended to,
            so a resumed run continues them).
    """

    def __init__(self, log_dir: str | Path):
        self.dir = Path(log_dir)
        self._files: dict[str, TextIO] = {}

    def open(self) -> None:
        for name in ("metrics.jsonl", "alerts.jsonl"):
            self._file(name)

    def _file(self, name: str) -> TextIO:
        """The open file ``name``; opened (``log_dir`` re-created if it was deleted) when it is not, or when the
        open one is no longer at its path: writing on into a deleted file would lose every record silently."""
        path = self.dir / name
        fh = self._files.get(name)
        if fh is not None and not os.path.exists(path):
            self._files.pop(name)
            fh.close()
            raise FileNotFoundError(errno.ENOENT, f"{path} was deleted mid-run; the next sample writes it anew")
        if fh is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            fh = self._files[name] = open(path, "a", encoding="utf-8")
        return fh

    def _write(self, name: str, record: dict[str, Any]) -> None:
        """One line, written whole or not at all: after a failed write (a full disk) the file is closed and
        reopened by the next write, which starts on a new line."""
        line = json.dumps(finite_json(record), allow_nan=False) + "\n"  # NaN/Inf as null, the documented form
        fh = self._file(name)
        try:
            fh.write(line)
            fh.flush()
        except OSError:
            self._files.pop(name, None)
            try:
                fh.close()
            except OSError:
                pass
            _truncate_torn_line(self.dir / name)
            raise

    def write_sample(self, sample: Sample, context: SampleContext) -> None:
        self._write("metrics.jsonl", sample.to_dict(context.run))

    def resume(self, run: str, step: int) -> None:
        """Rewrite both files without ``run``'s records past ``step`` and without a cut-off last line (a run killed
        while writing it); a file with nothing to drop is left as it is."""
        for name in ("metrics.jsonl", "alerts.jsonl"):
            fh = self._files.pop(name, None)  # reopened by the next write: the rewrite replaces the file
            if fh is not None:
                fh.close()
            path = self.dir / name
            try:
                with open(path, "rb") as lines:
                    dropped = sum(_superseded(line, run, step) for line in lines)
            except FileNotFoundError:
                continue
            if dropped:
                with open(path, "rb") as lines, atomic_write(path) as out:
                    out.writelines(line for line in lines if not _superseded(line, run, step))
                logger.info("isiwatch: run %s resumes after step %d: dropped %d line%s of %s that the run wrote "
                            "after it", run, step, dropped, "s" * (dropped != 1), path)

    def write_alert(self, alert: Alert) -> None:
        self._write("alerts.jsonl", alert.to_dict())

    def close(self, context: SampleContext) -> None:
        files, self._files = self._files, {}
        for fh in files.values():
            fh.close()


def _superseded(line: bytes, run: str, step: int) -> bool:
    """Whether a resume after ``step`` of ``run`` drops ``line``: a record of that run at a later step, or a line cut
    off by a kill (no newline: the next append would join it). A line that is not JSON is left to the reader."""
    if not line.endswith(b"\n"):
        return True
    try:
        record = json.loads(line)
    except ValueError:
        return False
    later = isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] > step
    return later and record.get("run") == run


def _truncate_torn_line(path: Path) -> None:
    """Cut a partly written last line, so the file stays one JSON object per line."""
    try:
        with open(path, "rb+") as fh:
            data = fh.read()
            end = data.rfind(b"\n") + 1
            if end < len(data):
                fh.truncate(end)
    except OSError:
        pass
