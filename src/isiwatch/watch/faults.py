"""Fault isolation: nothing that fails inside the Watch reaches the training loop it watches.

Each part of a sample that can fail is a *source*: the probe pass with everything computed from it (metrics,
probes, phases, depth, alert rules, the stopping rule), each exporter and the user's ``alert_callback``. A source's
first failure opens an episode, reported once: a ``monitor_error`` alert record (the ``isiwatch`` logger and every
exporter get it; Prometheus counts it in ``isiwatch_alerts_total{kind="monitor_error"}``) and, when the application
has set up no logging, one line on stderr, so a contained failure is never silent. Further failures of the same
source are counted, not repeated. The episode closes, with a ``monitor_error_cleared`` record, once the source has
worked `CLEAR_AFTER` times in a row (for the probe pass and an exporter: that many samples): a failure in between
restarts that count inside the same episode, so a fault that comes and goes (a file-descriptor shortage that lets
every other write through) is one episode, not one per success.

Each such part runs under one [`FaultGuard`][isiwatch.watch.faults.FaultGuard] (`FaultLog.guard`), a context manager
that contains what the part raises and reports it (or re-raises it under the Watch's ``strict`` option).
"""

from __future__ import annotations

import importlib
import logging
import sys
import time
from collections.abc import Mapping
from types import TracebackType

from .alerts import ALERT_KINDS, Alert, AlertEngine, alert_line

logger = logging.getLogger("isiwatch")

KIND = "monitor_error"
assert KIND in ALERT_KINDS


def logging_configured(log: logging.Logger = logger) -> bool:
    """Whether a record of ``log`` reaches a real handler (one that is not a ``NullHandler``), as it does once the
    application calls ``logging.basicConfig`` or adds a handler anywhere up the logger's chain."""
    current: logging.Logger | None = log
    while current is not None:
        if any(not isinstance(h, logging.NullHandler) for h in current.handlers):
            return True
        current = current.parent if current.propagate else None
    return False


def to_stderr(line: str) -> None:
    """Print ``line`` on stderr when no logging is set up; a closed or missing stderr loses the line, never raises."""
    if logging_configured() or sys.stderr is None:
        return
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def warn(message: str) -> None:
    """A warning on the ``isiwatch`` logger that the user sees even without logging set up: then also one line on
    stderr (the logger's own handler is a ``NullHandler``, so a library prints nothing unasked otherwise).

    Args:
        message: One line, without the ``isiwatch:`` prefix.
    """
    logger.warning("isiwatch: %s", message)
    to_stderr(f"isiwatch: warning: {message}")


def import_cleanly(*names: str) -> None:
    """Import the modules ``names``, all or none: when one fails half-way (no file descriptor left, no memory),
    every module the attempt added to ``sys.modules`` is removed before the failure is raised, so the next attempt
    imports afresh. Left in place, a package's submodules would keep the half-initialised package for good
    (matplotlib's then lacks ``get_data_path`` until the process ends)."""
    before = set(sys.modules)
    try:
        for name in names:
            importlib.import_module(name)
    except BaseException:
        for added in set(sys.modules) - before:
            sys.modules.pop(added, None)
        raise


#: The fault source of the probe pass and everything computed from it.
PROBE_PASS = "probe pass"

#: Times in a row a failing source must work before its episode closes.
CLEAR_AFTER = 2

#: The most characters of a failure's reason a record or a stderr line carries.
REASON_LIMIT = 200


def printable(text: str, limit: int = REASON_LIMIT) -> str:
    """``text`` as one printable line of at most ``limit`` characters: every character that is not printable (a
    control character, a line break, a terminal escape sequence's ESC) as its Python escape (``\\x1b``), and the
    rest after ``limit`` cut off with ``...``; what a server or a library sent never reaches a terminal raw."""
    line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return line if len(line) <= limit and len(text) <= limit else line[:limit - 3] + "..."


def describe(exc: BaseException) -> str:
    """One printable line naming the exception: its type and the first line of its message (see
    `printable`)."""
    text = str(exc).strip().splitlines()
    return printable(f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__)


class FaultLog:
    """The open fault episodes of one Watch, by source, reported through its alert engine.

    Args:
        alerts: The Watch's alert engine: it dispatches the records and holds ``monitor_error`` among its open
            kinds while any source is failing.
        echo: Print each record on stderr when no logging is set up; False on the ranks other than 0 of a
            distributed job, which stay silent unless the application sets up logging there (rank 0 reports
            every sample that failed on any rank).
    """

    def __init__(self, alerts: AlertEngine, echo: bool = True):
        self.alerts = alerts
        self.echo = echo
        #: The record that opened each failing source's episode.
        self.failing: dict[str, Alert] = {}
        #: Failures per source since its episode opened (the first included).
        self.counts: dict[str, int] = {}
        #: Times each failing source has worked since its last failure.
        self.successes: dict[str, int] = {}
        #: Samples in a row that failed (on any rank) since the last one that worked.
        self.failed_samples = 0

    def failed(self, source: str, step: int, exc: BaseException | str) -> None:
        """Record a failure of ``source`` at training step ``step``; report it if it opens an episode.

        Args:
            source: What failed (``"probe pass"``, ``"exporter TensorBoardExporter"``).
            step: The training step of the sample.
            exc: The exception, or a one-line reason.
        """
        self.counts[source] = self.counts.get(source, 0) + 1
        self.successes.pop(source, None)
        if source in self.failing:
            return
        reason = printable(exc) if isinstance(exc, str) else describe(exc)
        record = Alert(KIND, step, time.time(), self.alerts.run, ALERT_KINDS[KIND],
                       f"{source} failed ({reason}); the sample's other parts and training continue",
                       {"source": source, "error": reason})
        self.failing[source] = record  # before dispatching: a sink that fails on this record reports nothing new
        if KIND not in self.alerts.active:
            self.alerts.active.add(KIND)
            self.alerts.opened[KIND] = record
        self.report(record)

    def recovered(self, source: str, step: int) -> None:
        """Record that ``source`` worked at ``step``; close its episode, if it has one, when that makes
        `CLEAR_AFTER` times in a row.

        Args:
            source: What worked.
            step: The training step of the sample.
        """
        if source not in self.failing:
            return
        self.successes[source] = self.successes.get(source, 0) + 1
        if self.successes[source] < CLEAR_AFTER:
            return
        opened = self.failing.pop(source)
        del self.successes[source]
        count = self.counts.pop(source, 0)
        if not self.failing:
            self.alerts.active.discard(KIND)
            self.alerts.opened.pop(KIND, None)
        self.report(Alert(f"{KIND}_cleared", step, time.time(), self.alerts.run, "info",
                          f"{source} works again after {count} failure{'s' * (count != 1)} since step {opened.step}",
                          {"source": source, "failures": count}))

    def sample_failed(self, step: int, failure: BaseException | str, limit: int) -> bool:
        """Record a sample at ``step`` that failed, here (``failure``, the exception) or on another rank (a reason),
        as a failure of the probe pass; the ``limit``-th in a row is also reported as the Watch disabling itself
        (a critical record). Returns whether it does."""
        self.failed(PROBE_PASS, step, failure)
        self.failed_samples += 1
        if self.failed_samples < limit:
            return False
        self.report(Alert(KIND, step, time.time(), self.alerts.run, "critical",
                          f"isiwatch disabled itself after {self.failed_samples} failed samples in a row; training "
                          f"continues unmonitored", {"source": "watch", "disabled": True}))
        return True

    def sample_worked(self, step: int) -> None:
        """Record a sample at ``step`` that worked on every rank: the probe pass works, and no sample failed since."""
        self.failed_samples = 0
        self.recovered(PROBE_PASS, step)

    def report(self, record: Alert) -> None:
        """Print ``record`` on stderr when no logging is set up (and ``echo``), then dispatch it to the Watch's
        sinks (printed first: a sink may report a failure of its own, whose line then follows this one)."""
        if self.echo:
            to_stderr(f"isiwatch: {alert_line(record)}")
        self.alerts.dispatch(record)

    def guard(self, source: str, step: int, *, strict: bool = False, report: bool = True, recover: bool = True,
              sources_by_type: Mapping[type[Exception], str] | None = None) -> FaultGuard:
        """A [`FaultGuard`][isiwatch.watch.faults.FaultGuard] for ``source`` at ``step`` that reports here (its
        arguments are the guard's)."""
        return FaultGuard(self, source, step, strict=strict, report=report, recover=recover,
                          sources_by_type=sources_by_type)


class FaultGuard:
    """Contains what a ``with guard:`` block raises, so that a failing part of the Watch never reaches training: the
    exception is kept in `failures` and reported as a failure of ``source`` (`FaultLog.failed`); a block that
    works counts towards closing ``source``'s episode (`FaultLog.recovered`). One guard may wrap several blocks.

    Args:
        faults: The fault log that reports.
        source: What the blocks are (``"alert rules"``, ``"exporter JsonlExporter"``).
        step: The training step the records name.
        strict: Re-raise instead of containing (the Watch's ``strict`` option, for tests and debugging).
        report: Report a failure now; False only keeps it, for a caller that reports it later (the probe pass,
            once the ranks have agreed whether any of them failed).
        recover: Count a block that works towards closing the episode; False for a caller that decides itself.
        sources_by_type: Exception types that are an episode of their own, reported under the source given here
            instead of ``source``; a block that works closes those episodes too.
    """

    def __init__(self, faults: FaultLog, source: str, step: int, *, strict: bool = False, report: bool = True,
                 recover: bool = True, sources_by_type: Mapping[type[Exception], str] | None = None):
        self.faults, self.source, self.step = faults, source, step
        self.strict, self.report, self.recover = strict, report, recover
        self.sources_by_type = dict(sources_by_type or {})
        #: What the blocks raised and the guard contained, in order.
        self.failures: list[Exception] = []

    @property
    def failure(self) -> Exception | None:
        """The first exception contained, or None when every block worked."""
        return self.failures[0] if self.failures else None

    def recovered(self) -> None:
        """Count the blocks so far as one attempt of ``source`` that worked, unless one of them failed: for a guard
        made with ``recover=False`` whose blocks belong together (the freeze policy's steps at one sample)."""
        if not self.failures:
            self.faults.recovered(self.source, self.step)

    def __enter__(self) -> FaultGuard:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> bool:
        if exc is None:
            if self.recover:
                for source in (self.source, *self.sources_by_type.values()):
                    self.faults.recovered(source, self.step)
            return False
        if not isinstance(exc, Exception) or self.strict:
            return False
        self.failures.append(exc)
        if self.report:
            source = next((s for t, s in self.sources_by_type.items() if isinstance(exc, t)), self.source)
            self.faults.failed(source, self.step, exc)
        return True
