"""Alerts: the rules that decide each alert kind's condition at a sample, and the episode logic that emits
each alert once.

Rules (`AlertRules`): ``non_finite``, ``plateau_onset``, ``slow_start``, ``isi_stall``, ``cls_marginalized`` and
``norm_friction_high`` (`isiwatch.watch.friction`); what each means is its line in
`isiwatch.measure.vocabulary.ALERTS`, the one table the terminal, the report and the docs render.

A condition that becomes true opens an episode and emits one [`Alert`][isiwatch.Alert]; while it stays true nothing
more is emitted; when it goes away a ``<kind>_cleared`` record closes the episode. Sinks receive every
record; a failing sink is logged and never interrupts training.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from .._utils.state import checked, is_count
from ..measure.vocabulary import ALERTS, PHASES, alert_hint, plateau_name
from .friction import friction_alert
from .probe_evidence import PairedProbes, holds

if TYPE_CHECKING:
    from ..measure.phases import PlateauTracker
    from .sample import Sample

logger = logging.getLogger("isiwatch")

SEVERITY_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "critical": logging.ERROR}
#: The alert kinds that open episodes and their severity (the two action records, ``early_stop`` and
#: ``blocks_frozen``, open none); each kind's meaning is in `isiwatch.measure.vocabulary.ALERTS`.
ALERT_KINDS = {"plateau_onset": "warning", "slow_start": "info", "isi_stall": "warning", "cls_marginalized": "info",
               "non_finite": "critical", "norm_friction_high": "info", "monitor_error": "warning"}
assert set(ALERT_KINDS) <= set(ALERTS)


@dataclass
class Alert:
    """One alert record: ``kind`` (``*_cleared`` closes an episode), the training ``step``, unix ``time``;
    ``hint``: what to try next, by default its kind's (`isiwatch.measure.vocabulary.HINTS`, with the record's span),
    "" for a ``*_cleared`` record."""

    kind: str
    step: int
    time: float
    run: str
    severity: str
    message: str
    data: dict[str, Any] = field(default_factory=dict)
    hint: str = ""

    def __post_init__(self) -> None:
        self.hint = self.hint or alert_hint(self.kind, self.data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Condition:
    """The state of one alert condition at one sample."""

    active: bool
    message: str = ""
    data: dict[str, Any] = field(default_factory=dict)


AlertSink = Callable[[Alert], None]


def non_finite(sample: Sample) -> Condition:
    """Any non-finite value in a curve or the loss (the series are named)."""
    bad = sorted(m for m, vals in sample.layers.items() if not all(math.isfinite(v) for v in vals))
    if sample.loss is not None and not math.isfinite(sample.loss):
        bad.append("loss")
    if not bad:  # its clearing names what the episode opened with
        return Condition(False)
    return Condition(True, f"non-finite values in {', '.join(bad)}", {"series": bad})


def plateau_onset(sample: Sample, tracker: PlateauTracker, metric: str, kind: str = "plateau_onset") -> Condition:
    """Plateau onset as ``tracker`` (already updated with ``sample``) decides it, with the sample's span:
    ``kind`` ``"plateau_onset"`` while the stable span follows a Cliff, ``"slow_start"`` while it starts at block 0."""
    ph = sample.phases
    held = tracker.span
    active = tracker.active and held is not None and (plateau_name(held) == "slow start") == (kind == "slow_start")
    if ph is None:
        message = f"no flat stretch in {metric} at this sample"
    else:
        message = (f"{ph.plateau_name} over blocks {ph.plateau[0]}–{ph.plateau[1]} of {metric} "
                   f"({PHASES[ph.plateau_name]})")
    return Condition(active, message,
                     {"plateau": list(ph.plateau) if ph else None, "onset_step": tracker.onset_step, "metric": metric})


def cls_marginalized(sample: Sample, was_open: bool, confidence: float) -> Condition | None:
    """The [CLS] probe below the mean-patch probe at the last block, beyond the probes' own noise: the exact paired
    test on their held-out predictions (`isiwatch.watch.probe_evidence`) opens the episode only when the mean-patch
    probe is better at ``confidence``, and an open episode (``was_open``) closes only when the [CLS] probe is no longer
    observed behind (as many held-out images right only for it as only for the mean-patch probe, or more). None
    without both probes' held-out predictions, or when either accuracy is not finite (probes on NaN features:
    ``non_finite`` says so, and this episode stays as it was)."""
    layers, held_out = sample.layers, sample.held_out
    if not {"probe_cls", "probe_patch_mean"} <= set(layers) & set(held_out):
        return None
    cls_acc, patch_acc = layers["probe_cls"][-1], layers["probe_patch_mean"][-1]
    cls_right, patch_right = held_out["probe_cls"][-1], held_out["probe_patch_mean"][-1]
    if not (math.isfinite(cls_acc) and math.isfinite(patch_acc)) or cls_right is None or patch_right is None:
        return None
    pair = PairedProbes.of(cls_right, patch_right)
    return Condition(holds(was_open, pair, confidence),
                     f"[CLS] probe {cls_acc:.3f} vs mean-patch probe {patch_acc:.3f} at the last block "
                     f"({pair.only_second} of {pair.images} held-out images right only for the mean-patch probe, "
                     f"{pair.only_first} only for [CLS]; exact paired p = {pair.p_value:.2g})",
                     {"probe_cls": cls_acc, "probe_patch_mean": patch_acc,
                      **pair.to_dict("cls", "patch_mean", confidence)})


def norm_friction_high(sample: Sample, threshold: float | None) -> Condition | None:
    """[`friction_alert`][isiwatch.friction_alert] as a condition; None without a threshold or a friction curve."""
    if threshold is None or "norm_friction" not in sample.layers:
        return None
    found = friction_alert(sample.layers, threshold)
    return Condition(found is not None, found["message"] if found else "", found["data"] if found else {})


class AlertRules:
    """Every alert rule of a Watch, with the one piece of history a rule keeps: ``stall``, the (mean ISI, loss)
    pairs of the last ``isi_stall_window`` samples with both finite; ``probe_confidence`` is the confidence at which
    ``cls_marginalized`` compares the probes."""

    def __init__(self, phase_metric: str, isi_stall_window: int, isi_stall_min_rise: float,
                 isi_stall_min_loss_drop: float, norm_friction_threshold: float | None = None, *,
                 probe_confidence: float):
        self.phase_metric = phase_metric
        self.min_rise, self.min_loss_drop = isi_stall_min_rise, isi_stall_min_loss_drop
        self.norm_friction_threshold = norm_friction_threshold
        self.probe_confidence = probe_confidence
        self.stall: deque[tuple[float, float]] = deque(maxlen=isi_stall_window)

    def conditions(self, sample: Sample, tracker: PlateauTracker, active: Set[str] = frozenset()
                   ) -> dict[str, Condition]:
        """The condition of every alert kind that applies to ``sample`` (``tracker`` already updated with it), with
        ``active`` the kinds whose episodes are open (a rule with hysteresis decides from where it stands)."""
        conditions = {"non_finite": non_finite(sample),
                      "plateau_onset": plateau_onset(sample, tracker, self.phase_metric),
                      "slow_start": plateau_onset(sample, tracker, self.phase_metric, "slow_start"),
                      "isi_stall": self.isi_stall(sample)}
        cls = cls_marginalized(sample, "cls_marginalized" in active, self.probe_confidence)
        for kind, condition in (("cls_marginalized", cls),
                                ("norm_friction_high", norm_friction_high(sample, self.norm_friction_threshold))):
            if condition is not None:
                conditions[kind] = condition
        return conditions

    def isi_stall(self, sample: Sample) -> Condition:
        """Adds the sample's mean ISI and loss to `stall`; active when the window is full, mean ISI rose by
        at most ``min_rise`` (relative) and the loss fell by at least ``min_loss_drop`` (relative)."""
        isi = sample.layers.get("isi")
        if isi is None or sample.loss is None or not all(math.isfinite(v) for v in [*isi, sample.loss]):
            return Condition(False)
        self.stall.append((sum(isi) / len(isi), sample.loss))
        if len(self.stall) < (self.stall.maxlen or 0):
            return Condition(False)
        (isi0, loss0), (isi1, loss1) = self.stall[0], self.stall[-1]
        stalled = isi1 - isi0 <= self.min_rise * abs(isi0)
        falling = loss0 - loss1 >= self.min_loss_drop * abs(loss0)
        return Condition(stalled and falling,
                         f"mean ISI {isi0:.4f} → {isi1:.4f} over {len(self.stall)} samples while loss "
                         f"{loss0:.4f} → {loss1:.4f}", {"isi": [isi0, isi1], "loss": [loss0, loss1]})


def log_sink(alert: Alert) -> None:
    """Python logging: logger ``isiwatch``, level from the severity."""
    logger.log(SEVERITY_LEVELS.get(alert.severity, logging.INFO), "%s", alert_line(alert))


def alert_line(alert: Alert) -> str:
    """An alert record as one terminal line: ``[kind] step N: message (hint: ...)``."""
    return f"[{alert.kind}] step {alert.step}: {alert.message}" + (f" (hint: {alert.hint})" if alert.hint else "")


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
                records.append(Alert(f"{kind}_cleared", step, now, self.run, "info",
                                     _cleared(kind, cond, self.opened.pop(kind, None)), dict(cond.data)))
        records.sort(key=lambda a: not a.kind.endswith("_cleared"))  # a slow start that became a plateau: closed first
        for record in records:
            self.dispatch(record)
        return records

    def dispatch(self, alert: Alert) -> None:
        for sink in self.sinks:
            try:
                sink(alert)
            except Exception:  # a broken sink must not stop training
                logger.exception("isiwatch: alert sink %r failed", sink)

    def state_dict(self) -> dict[str, Any]:
        return {"active": sorted(self.active),
                "opened": {kind: {"step": a.step, "time": a.time, "message": a.message, "data": a.data}
                           for kind, a in sorted(self.opened.items())}}

    def load_state_dict(self, state: Mapping[str, Any], where: str = "AlertEngine state") -> None:
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


def _cleared(kind: str, condition: Condition, opened: Alert | None) -> str:
    """A clearing record's message: the condition's account of the sample that cleared it, else (a rule with
    nothing to say once it holds no more, as ``non_finite``) the record that opened the episode."""
    if condition.message:
        return f"{kind} cleared: {condition.message}"
    return f"{kind} cleared" + (f" (opened at step {opened.step}: {opened.message})" if opened else "")


def _episode(entry: object) -> bool:
    return (isinstance(entry, dict) and is_count(entry.get("step")) and isinstance(entry.get("time"), (int, float))
            and isinstance(entry.get("message"), str) and isinstance(entry.get("data"), dict))
