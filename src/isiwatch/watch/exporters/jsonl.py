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
from ..log_folder import FolderInUse, LogFolderLock
from ..sample import Sample
from .base import Exporter, SampleContext

logger = logging.getLogger("isiwatch")


class JsonlExporter(Exporter):
    """Appends one JSON object per line and flushes, so a crashed run keeps everything written so far. Every line
    is strict JSON: a NaN or infinite number is written as ``null``. A resume drops the lines the crashed run wrote
    after the checkpoint, so each step of a run has one record (see ``resume``).

    One writer per folder: the exporter holds the folder's lock (`LogFolderLock`) from construction, or from its
    first write when the folder could not be written before, to ``close``; a write while another Watch holds the
    folder raises `FolderInUse` and writes nothing (the Watch reports it once and counts the samples not written).

    Args:
        log_dir: The folder of ``metrics.jsonl`` and ``alerts.jsonl`` (created if missing, by
            [`open`][isiwatch.Exporter.open] or the first write; existing files are appended to,
            so a resumed run continues them).
        run: The run's name, recorded in the lock for the refusal another writer gets.
        lock: The folder's lock when another exporter of the Watch shares it and releases it (TensorBoard's, which
            closes after this one); by default its own, released by ``close``.

    Raises:
        FolderInUse: Another Watch (or exporter) writes ``log_dir``.
    """

    def __init__(self, log_dir: str | Path, run: str = "", lock: LogFolderLock | None = None):
        self.dir = Path(log_dir)
        self._files: dict[str, TextIO] = {}
        self._lock = lock or LogFolderLock(self.dir, run)
        self._owns_lock = lock is None  # a shared lock is released by the exporter that closes last
        #: Resumes whose rewrite has not succeeded yet, by file: (run, step, bytes of the file the rewrite filters;
        #: what was appended after the resume is the resumed run's and is kept as it is).
        self._pending: dict[str, tuple[str, int, int]] = {}

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
            self._lock.claim()  # not taken when the folder could not be written before: first, before any line
            fh = self._files[name] = open(path, "a", encoding="utf-8")
        return fh

    def _write(self, name: str, record: dict[str, Any]) -> None:
        """One line, written whole or not at all: after a failed write (a full disk) the file is closed and
        reopened by the next write, which starts on a new line. A resume's rewrite that failed is retried first;
        while it keeps failing the line is still appended and the failure raised, so the episode stays open until
        the log is true again."""
        line = json.dumps(finite_json(record), allow_nan=False) + "\n"  # NaN/Inf as null, the documented form
        pending: OSError | None = None
        if name in self._pending:
            try:
                self._rewrite(name)
            except OSError as exc:
                pending = exc
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
        if pending is not None:
            raise pending

    def write_sample(self, sample: Sample, context: SampleContext) -> None:
        self._write("metrics.jsonl", sample.to_dict(context.run))

    def resume(self, run: str, step: int) -> None:
        """Rewrite both files without ``run``'s records past ``step`` and without a cut-off last line (a run killed
        while writing it); a file with nothing to drop is left as it is. A rewrite that fails (a full disk) stays
        pending: each later write of that file retries it, and fails until it succeeds."""
        for name in ("metrics.jsonl", "alerts.jsonl"):
            fh = self._files.pop(name, None)  # reopened by the next write: the rewrite replaces the file
            if fh is not None:
                fh.close()
            path = self.dir / name
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue
            self._pending[name] = (run, step, size)
        failures: list[Exception] = []
        for name in list(self._pending):
            try:
                self._rewrite(name)
            except FolderInUse as exc:  # another Watch writes the folder: its files are not this run's to rewrite
                failures.append(exc)
            except OSError as exc:
                _truncate_torn_line(self.dir / name)  # so the next append starts a line of its own
                failures.append(exc)
        if failures:
            raise failures[0]

    def _rewrite(self, name: str) -> None:
        """Carry out the pending resume of ``name``: drop the superseded lines among the bytes it covers, keep the
        rest and whatever was appended since."""
        run, step, size = self._pending[name]
        path = self.dir / name
        self._lock.claim()
        try:
            with open(path, "rb") as fh:
                head = fh.read(size)
                tail = fh.read()
        except FileNotFoundError:  # deleted since: nothing left to drop
            self._pending.pop(name)
            return
        lines = head.splitlines(keepends=True)
        kept = [line for line in lines if not _superseded(line, run, step)]
        dropped = len(lines) - len(kept)
        if dropped:
            stale = self._files.pop(name, None)  # appended to since the resume: the rewrite replaces that file
            if stale is not None:
                stale.close()
            with atomic_write(path) as out:
                out.writelines(kept)
                out.write(tail)
            logger.info("isiwatch: run %s resumes after step %d: dropped %d line%s of %s that the run wrote "
                        "after it", run, step, dropped, "s" * (dropped != 1), path)
        self._pending.pop(name)

    def rename(self, run: str) -> None:
        self._lock.rename(run)

    def write_alert(self, alert: Alert) -> None:
        self._write("alerts.jsonl", alert.to_dict())

    def close(self, context: SampleContext) -> None:
        files, self._files = self._files, {}
        for fh in files.values():
            fh.close()
        if self._owns_lock:
            self._lock.release()


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
