"""The Watch's saved state ([`Watch.state_dict`][isiwatch.Watch.state_dict]) and reading it back: validated whole,
and loaded into fresh policies, before the Watch assigns anything, so a bad state leaves it as it was.

States saved by older versions lack ``run``, ``step``, ``interval``, ``freezer`` and ``run_folder``: each falls back
to what the Watch would have had (``run_folder``: ``log_dir`` itself, where those versions wrote). The interval is
rescaled to this run's ``every_n_steps`` and ``overhead_budget``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._utils.state import PRESENT, checked, is_count, is_number, optional
from .alerts import AlertEngine
from .config import WatchOptions
from .faults import KIND as FAULT_KIND
from .policies import Policies, new_policies
from .run_folder import folder_problem
from .sampling_clock import resumed_interval

#: The version of the state's format that `SavedState.to_dict` writes and `read_state` reads.
STATE_VERSION = 1


def _saved_alerts(alerts: AlertEngine) -> dict[str, Any]:
    """The alert episodes to save, less ``monitor_error``: a fault belongs to this process, not the run."""
    state = alerts.state_dict()
    state["active"] = [k for k in state["active"] if k != FAULT_KIND]
    state["opened"].pop(FAULT_KIND, None)
    return state


def _stall_entry(entry: object) -> bool:
    return isinstance(entry, (list, tuple)) and len(entry) == 2 and all(is_number(v) for v in entry)


@dataclass
class SavedState:
    """What a Watch saves to resume a run, and [`read_state`][isiwatch.watch.saved_state.read_state] reads back.

    Args:
        run: The run's name (the one its exporters write under).
        step: The step the run had reached (None before any): a resumed run continues after it, so what a
            crashed run logged for later steps is dropped.
        last_step: The last step sampled.
        should_stop: Whether the Watch asked training to stop, and why (``stop_reason``).
        policies: Onset tracking and early stopping.
        alerts: The open alert episodes; ``alerts.run`` is the name the resumed Watch takes (its own ``run_name``
            when it has one).
        isi_stall: The ``isi_stall`` rule's window, (mean ISI, loss) pairs.
        interval: The sampling interval (on reading, fitted to the resumed Watch's options).
        freezer: The freeze policy's state (its own ``state_dict``), None when it is off.
        run_folder: The run's folder relative to ``log_dir`` (``.``: ``log_dir`` itself), None when the Watch wrote
            none: a resumed Watch writes on there.
    """

    run: str
    step: int | None
    last_step: int | None
    should_stop: bool
    stop_reason: str | None
    policies: Policies
    alerts: AlertEngine
    isi_stall: list[tuple[float, float]]
    interval: int
    freezer: Mapping[str, Any] | None
    run_folder: str | None

    def to_dict(self) -> dict[str, Any]:
        """The state as the Watch's ``state_dict`` returns it (plain data; ``monitor_error`` left out)."""
        tracker, stoppers, plateau_stopper = self.policies
        return {"version": STATE_VERSION, "run": self.run, "step": self.step, "last_step": self.last_step,
                "should_stop": self.should_stop, "stop_reason": self.stop_reason, "tracker": tracker.state_dict(),
                "alerts": _saved_alerts(self.alerts), "stoppers": [s.state_dict() for s in stoppers],
                "plateau_stopper": plateau_stopper.state_dict() if plateau_stopper else None,
                "isi_stall": [list(p) for p in self.isi_stall], "interval": self.interval, "freezer": self.freezer,
                "run_folder": self.run_folder}


def read_state(state: Mapping[str, Any], opts: WatchOptions, run: str) -> SavedState:
    """``state`` checked against the Watch's options ``opts`` and loaded into fresh policies; ``run`` is the Watch's
    current name, kept when the state has none. Raises ``ValueError`` naming the first bad field."""
    version = checked(state, "Watch state", version=PRESENT)["version"]
    if version != STATE_VERSION:
        raise ValueError(f"unsupported Watch state version {version!r}")
    policies = new_policies(opts)
    count = len(policies.stoppers)
    s = checked(state, "Watch state", last_step=(optional(is_count), "null or an int >= 0"),
                should_stop=(lambda v: isinstance(v, bool), "a bool"),
                stop_reason=(optional(lambda v: isinstance(v, str)), "null or a string"),
                tracker=PRESENT, alerts=PRESENT, plateau_stopper=PRESENT,
                stoppers=(lambda v: isinstance(v, (list, tuple)) and len(v) == count,
                          f"a list of {count} early-stopping states (this Watch's monitor)"),
                isi_stall=(lambda v: isinstance(v, (list, tuple)) and all(_stall_entry(p) for p in v),
                           "a list of [mean ISI, loss] pairs"))
    saved = state.get("run", run)  # absent in states saved before isiwatch recorded it
    if not isinstance(saved, str) or not saved:
        raise ValueError(f"invalid Watch state: 'run' must be a non-empty string, got {saved!r}")
    step = state.get("step", s["last_step"])  # absent in states saved before isiwatch recorded it
    if step is not None and not is_count(step):
        raise ValueError(f"invalid Watch state: 'step' must be null or an int >= 0, got {step!r}")
    interval = state.get("interval", opts.every_n_steps)  # absent in states saved before it existed
    if not is_count(interval) or interval < 1:
        raise ValueError(f"invalid Watch state: 'interval' must be an int >= 1, got {interval!r}")
    run_folder = state.get("run_folder", ".")  # absent in states saved before each run had its folder: log_dir
    if run_folder is not None and (not isinstance(run_folder, str) or folder_problem(run_folder)):
        raise ValueError(f"invalid Watch state: 'run_folder' must be null or a folder under log_dir, got "
                         f"{run_folder!r}")
    alerts = AlertEngine(opts.run_name or saved)  # an explicit run_name wins over the saved one
    policies.tracker.load_state_dict(s["tracker"], "Watch state['tracker']")
    alerts.load_state_dict(s["alerts"], "Watch state['alerts']")
    for i, (stopper, sub) in enumerate(zip(policies.stoppers, s["stoppers"])):
        stopper.load_state_dict(sub, f"Watch state['stoppers'][{i}]")
    if policies.plateau_stopper is not None and s["plateau_stopper"] is not None:
        policies.plateau_stopper.load_state_dict(s["plateau_stopper"], "Watch state['plateau_stopper']")
    return SavedState(saved, step, s["last_step"], s["should_stop"], s["stop_reason"], policies, alerts,
                      [(float(i), float(loss)) for i, loss in s["isi_stall"]],
                      resumed_interval(interval, opts.every_n_steps, opts.overhead_budget), state.get("freezer"),
                      run_folder)


def resume_alerts(alerts: AlertEngine, saved: AlertEngine) -> None:
    """Take ``saved``'s open episodes into the Watch's engine ``alerts``, which keeps its own ``monitor_error``: a
    fault belongs to this process, not the run."""
    alerts.active = saved.active | (alerts.active & {FAULT_KIND})
    alerts.opened = {**saved.opened, **{k: v for k, v in alerts.opened.items() if k == FAULT_KIND}}
