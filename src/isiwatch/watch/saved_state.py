"""Reading back a Watch's saved state ([`Watch.state_dict`][isiwatch.Watch.state_dict]): validated whole, and
loaded into fresh policies, before the Watch assigns anything, so a bad state leaves it as it was.

States saved by older versions lack ``run``, ``step``, ``interval`` and ``freezer``: each falls back to what the
Watch would have had. The interval is rescaled to this run's ``every_n_steps`` and ``overhead_budget``.
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
from .sampling_clock import resumed_interval

#: The version of the state's format that `state_dict` writes and `read_state` reads.
STATE_VERSION = 1


def saved_alerts(alerts: AlertEngine) -> dict[str, Any]:
    """The alert episodes to save, less ``monitor_error``: a fault belongs to this process, not the run."""
    state = alerts.state_dict()
    state["active"] = [k for k in state["active"] if k != FAULT_KIND]
    state["opened"].pop(FAULT_KIND, None)
    return state


def _stall_entry(entry: object) -> bool:
    return isinstance(entry, (list, tuple)) and len(entry) == 2 and all(is_number(v) for v in entry)


@dataclass
class SavedState:
    """A saved state, checked, with its policies and alert episodes loaded into fresh objects.

    Args:
        saved_run: The run's name in the state (the one its exporters wrote under).
        run: The name the resumed Watch takes: its own ``run_name`` when it has one, else ``saved_run``.
        step: The step the saved run had reached (None before any), where the resumed run continues.
        interval: The sampling interval to resume with, fitted to this Watch's options.
        isi_stall: The ``isi_stall`` rule's window, (mean ISI, loss) pairs.
        freezer: The freeze policy's state, for the Watch's freezer to check and load; None when absent.
    """

    saved_run: str
    run: str
    step: int | None
    last_step: int | None
    should_stop: bool
    stop_reason: str | None
    policies: Policies
    alerts: AlertEngine
    interval: int
    isi_stall: list[tuple[float, float]]
    freezer: Mapping[str, Any] | None


def read_state(state: Mapping[str, Any], opts: WatchOptions, run: str) -> SavedState:
    """``state`` checked against the Watch's options ``opts``; ``run`` is the Watch's current name, kept when
    the state has none. Raises ``ValueError`` naming the first bad field."""
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
    alerts = AlertEngine(opts.run_name or saved)  # an explicit run_name wins over the saved one
    policies.tracker.load_state_dict(s["tracker"], "Watch state['tracker']")
    alerts.load_state_dict(s["alerts"], "Watch state['alerts']")
    for i, (stopper, sub) in enumerate(zip(policies.stoppers, s["stoppers"])):
        stopper.load_state_dict(sub, f"Watch state['stoppers'][{i}]")
    if policies.plateau_stopper is not None and s["plateau_stopper"] is not None:
        policies.plateau_stopper.load_state_dict(s["plateau_stopper"], "Watch state['plateau_stopper']")
    return SavedState(saved, alerts.run, step, s["last_step"], s["should_stop"], s["stop_reason"], policies, alerts,
                      resumed_interval(interval, opts.every_n_steps, opts.overhead_budget),
                      [(float(i), float(loss)) for i, loss in s["isi_stall"]], state.get("freezer"))
