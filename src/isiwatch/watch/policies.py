"""The Watch's stopping policies: plateau-onset tracking and early stopping, built from the options, and the
reason to stop a sample gives them (the Watch agrees it over ranks and records the stop)."""

from __future__ import annotations

from typing import NamedTuple

from ..measure.phases import PlateauTracker
from .config import WatchOptions
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
