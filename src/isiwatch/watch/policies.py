"""The Watch's policies: plateau-onset tracking and early stopping, built from the options; the reason to stop a
sample gives them; and a sample of the freeze policy. They return data: the Watch agrees it over ranks and records
the stop or the freeze."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ..measure.phases import PlateauTracker
from .config import WatchOptions
from .faults import FaultGuard
from .freezing import Freezer
from .sample import Sample
from .stopping import EarlyStopping, PlateauStopping


class Policies(NamedTuple):
    """Onset tracking, the early-stopping rule on ``monitor`` (none without it) and ``stop_on_plateau``'s rule."""

    tracker: PlateauTracker
    stoppers: list[EarlyStopping]
    plateau_stopper: PlateauStopping | None


def new_policies(opts: WatchOptions) -> Policies:
    """Fresh policies from the options."""
    stoppers = [EarlyStopping(opts.monitor, opts.mode, opts.min_delta, opts.patience, opts.warmup,
                              opts.check_finite, opts.stopping_threshold, opts.divergence_threshold)
                ] if opts.monitor else []
    plateau_stopper = PlateauStopping(opts.plateau_patience) if opts.stop_on_plateau else None
    return Policies(PlateauTracker(opts.plateau_patience), stoppers, plateau_stopper)


def stop_reason(sample: Sample, probes: bool, stoppers: list[EarlyStopping],
                plateau_stopper: PlateauStopping | None) -> str | None:
    """Update the early-stopping policies with ``sample`` (a sample without its probes, under ``probe_every``,
    leaves the plateau rule, which reads the probe accuracy, as it was); the first reason to stop, if any."""
    series = sample.series()
    reasons = [stopper.update(series.get(stopper.monitor)) for stopper in stoppers]
    if plateau_stopper is not None and probes:
        reasons.append(plateau_stopper.update(sample.phases, sample.last_layer_accuracy()))
    return next((r for r in reasons if r), None)


def freeze(freezer: Freezer, agree: Callable[[int], int], guard: FaultGuard) -> tuple[str, dict[str, Any]] | None:
    """One sample of the freeze policy ([`Freezer.update`][isiwatch.watch.freezing.Freezer.update], its prefix
    agreed by ``agree``), each step under ``guard``, which counts the policy as working once no step failed. Returns
    the message and data of the ``blocks_frozen`` record when it froze blocks, else None."""
    before = freezer.frozen
    plan = freezer.update(agree, guard)
    guard.recovered()
    return None if plan is None else (freezer.message(plan, before), freezer.record_data(plan, before))
