"""Alert records and the episode logic that emits each alert once (SPEC §5).

A condition that becomes true opens an episode and emits one :class:`Alert`; while it stays true nothing
more is emitted; when it goes away a ``<kind>_cleared`` record closes the episode. Sinks receive every
record; a failing sink is logged and never interrupts training.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field

from .state import checked, is_count

logger = logging.getLogger("isiwatch")

SEVERITY_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "critical": logging.ERROR}
#: Alert kinds and their severity.
ALERT_KINDS = {"plateau_onset": "warning", "isi_stall": "warning", "cls_marginalized": "info",
               "non_finite": "critical", "norm_friction_high": "info"}


@dataclass
class Alert:
    """One alert record: ``kind`` (``*_cleared`` closes an episode), the training ``step``, unix ``time``."""

    kind: str
    step: int
    time: float
    run: str
    severity: str
    message: str
    data: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Condition:
    """The state of one alert condition at one sample."""

    active: bool
    message: str = ""
    data: dict = field(default_factory=dict)


AlertSink = Callable[[Alert], None]


def log_sink(alert: Alert) -> None:
    """Python logging: logger ``isiwatch``, level from the severity."""
    logger.log(SEVERITY_LEVELS.get(alert.severity, logging.INFO), "[%s] step %d: %s", alert.kind, alert.step,
               alert.message)


class AlertEngine:
    """Tracks open episodes per kind and dispatches records to the sinks."""

    def __init__(self, run: str, sinks: Iterable[AlertSink] = ()):
        self.run = run
        self.sinks = list(sinks)
        self.active: set[str] = set()
        #: The record that opened each open episode (its step is where the episode began), when known.
        self.opened: dict[str, Alert] = {}

    def update(self, step: int, conditions: Mapping[str, Condition]) -> list[Alert]:
        """Emit records for episodes that open or close at ``step``."""
        records = []
        now = time.time()
        for kind, cond in conditions.items():
            severity = ALERT_KINDS.get(kind, "info")
            if cond.active and kind not in self.active:
                self.active.add(kind)
                self.opened[kind] = Alert(kind, step, now, self.run, severity, cond.message, dict(cond.data))
                records.append(self.opened[kind])
            elif not cond.active and kind in self.active:
                self.active.discard(kind)
                self.opened.pop(kind, None)
                records.append(Alert(f"{kind}_cleared", step, now, self.run, "info",
                                     f"{kind} cleared" + (f": {cond.message}" if cond.message else ""),
                                     dict(cond.data)))
        for record in records:
            self.dispatch(record)
        return records

    def dispatch(self, alert: Alert) -> None:
        for sink in self.sinks:
            try:
                sink(alert)
            except Exception:  # a broken sink must not stop training
                logger.exception("isiwatch: alert sink %r failed", sink)

    def state_dict(self) -> dict:
        return {"active": sorted(self.active),
                "opened": {kind: {"step": a.step, "time": a.time, "message": a.message, "data": a.data}
                           for kind, a in sorted(self.opened.items())}}

    def load_state_dict(self, state: dict, where: str = "AlertEngine state") -> None:
        """``opened`` (where each open episode began) is optional: states saved before it existed lack it."""
        kinds = (lambda v: isinstance(v, (list, tuple)) and all(isinstance(k, str) and k in ALERT_KINDS for k in v),
                 f"a list of alert kinds ({', '.join(ALERT_KINDS)})")
        active = set(checked(state, where, active=kinds)["active"])
        opened = {}
        if state.get("opened") is not None:
            episodes = checked(state, where, opened=(
                lambda v: isinstance(v, dict) and set(v) <= active and all(_episode(e) for e in v.values()),
                'a dict {kind: {"step", "time", "message", "data"}} over the active kinds'))["opened"]
            opened = {kind: Alert(kind, e["step"], float(e["time"]), self.run, ALERT_KINDS[kind], e["message"],
                                  dict(e["data"])) for kind, e in episodes.items()}
        self.active, self.opened = active, opened


def _episode(entry: object) -> bool:
    return (isinstance(entry, dict) and is_count(entry.get("step")) and isinstance(entry.get("time"), (int, float))
            and isinstance(entry.get("message"), str) and isinstance(entry.get("data"), dict))
