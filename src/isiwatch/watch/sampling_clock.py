"""The sampling clock: the interval between samples, and what each sample costs against the training it watches.

A sample's overhead (`Sample.overhead_s`, seconds) is its measurement plus the previous sample's work after measuring
and the exporters' background work since (heat-map renders); its ratio is that over the training time since the
previous sample ended. Under ``overhead_budget`` the clock fits the interval to the budget and returns each change
as data (an [`IntervalChange`][isiwatch.watch.sampling_clock.IntervalChange]); the Watch agrees it over ranks and
turns it into the ``sampling_interval`` record.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .sample import Sample

logger = logging.getLogger("isiwatch")

#: The record of each change of the sampling interval under ``overhead_budget`` (one record, no episode).
INTERVAL_KIND = "sampling_interval"
#: The most the interval grows at one sample under ``overhead_budget``: one slow probe pass (a stall, a paused
#: process) doubles it once, and the next normal sample shortens it again.
STRETCH_STEP = 2
#: The longest interval ``overhead_budget`` may set, in multiples of ``every_n_steps``: the Watch never samples
#: less often than this, whatever its overhead.
MAX_STRETCH = 16
#: The Watch's clock for durations, in seconds: monotonic, so a wall-clock jump (NTP, a suspended VM) never
#: turns into a negative or a giant duration.
_clock = time.monotonic
#: A duration reading longer than this (seconds: a week) is a broken clock, not a measurement, and is discarded.
MAX_READING_S = 7 * 86400.0

#: A stretch to this many times ``every_n_steps`` or more is also one line on stderr (when no logging is set up).
WARN_STRETCH = 4


def _plausible(seconds: float) -> bool:
    """Whether a duration reading can be a real one: finite, positive and under `MAX_READING_S`."""
    return math.isfinite(seconds) and 0 < seconds < MAX_READING_S


def resumed_interval(saved: int, every_n_steps: int, budget: float | None) -> int:
    """The interval a resumed run starts with: the saved one, as a multiple of this run's ``every_n_steps`` (at
    most `MAX_STRETCH` of them), under an ``overhead_budget``; ``every_n_steps`` without one."""
    if budget is None:
        return every_n_steps
    return min(every_n_steps * MAX_STRETCH, every_n_steps * max(1, math.ceil(saved / every_n_steps)))


@dataclass(frozen=True)
class IntervalChange:
    """One change of the sampling interval under ``overhead_budget``: ``interval`` steps instead of ``previous``,
    at an overhead ``ratio`` (None: no reading) against ``budget``."""

    interval: int
    previous: int
    ratio: float | None
    budget: float
    every_n_steps: int

    def message(self) -> str:
        """The ``sampling_interval`` record's text."""
        return (f"overhead ratio {self._shown:.4f} against a budget of {self.budget:.4f}: sampling every "
                f"{self.interval} steps instead of {self.previous}")

    def record_data(self) -> dict[str, Any]:
        """The ``sampling_interval`` record's data."""
        return {"interval": self.interval, "previous": self.previous, "ratio": self.ratio, "budget": self.budget,
                "max_interval": self.every_n_steps * MAX_STRETCH}

    def warning(self, step: int) -> str | None:
        """The stderr line of a change that reaches `WARN_STRETCH` times ``every_n_steps`` from below, else None."""
        base = self.every_n_steps
        if not self.previous < base * WARN_STRETCH <= self.interval:
            return None
        return (f"isiwatch: warning: step {step}: sampling every {self.interval} steps instead of every_n_steps="
                f"{base}: the Watch's overhead (ratio {self._shown:.4f}) is over overhead_budget={self.budget}; it "
                f"never samples less often than every {base * MAX_STRETCH} steps")

    @property
    def _shown(self) -> float:
        return self.ratio if self.ratio is not None else math.nan


class SamplingClock:
    """Charges each sample's cost and fits the sampling interval to the budget (see the module docstring).

    The Watch runs each sample inside [`timing`][isiwatch.watch.sampling_clock.SamplingClock.timing], calls
    [`charge`][isiwatch.watch.sampling_clock.SamplingClock.charge] once it is measured and, under a budget,
    [`fit`][isiwatch.watch.sampling_clock.SamplingClock.fit] with its overhead ratio.

    Args:
        every_n_steps: The shortest interval, in training steps; longer ones are multiples of it.
    """

    def __init__(self, every_n_steps: int):
        self.every_n_steps = every_n_steps
        self._begin = 0.0  # _clock() when the sample in progress began
        self._last_end: float | None = None  # _clock() when the previous sample's work ended
        self._last_end_step: int | None = None  # the step of that sample
        self._after_measure_s = 0.0  # the previous sample's work after its measurement, charged to the next
        self._measured_at: float | None = None

    @contextlib.contextmanager
    def timing(self, step: int) -> Iterator[None]:
        """The sample at training ``step`` runs inside the block: its work starts on entry and ends on exit, and what
        it did after measuring (`charge`) is charged to the next sample."""
        self._begin = _clock()
        try:
            yield
        finally:
            self._last_end, self._last_end_step = _clock(), step
            if self._measured_at is not None:
                self._after_measure_s += self._last_end - self._measured_at
                self._measured_at = None

    def charge(self, sample: Sample | None, interval: int, background_seconds: Callable[[], float]) -> None:
        """Set ``sample``'s overhead, measured now: its measurement plus the previous sample's work after measuring
        and ``background_seconds()``, the exporters' CPU seconds off the training thread since the last sample, over
        the training time since the previous sample ended (see `_interval_seconds`; ``interval``: the one in effect).
        Called before anything reads the sample's series; a failed sample (None) carries its cost to the next."""
        measured = _clock()
        cost = measured - self._begin + self._after_measure_s + background_seconds()
        self._measured_at = measured
        if sample is None:
            self._after_measure_s = cost if _plausible(cost) else 0.0
            return
        self._after_measure_s = 0.0
        trained = None if self._last_end is None else self._begin - self._last_end
        if not _plausible(cost) or (trained is not None and not _plausible(trained)):
            logger.info("isiwatch: step %d: discarded an impossible duration reading (cost %r s, training %r s); "
                        "the sampling interval stays %d", sample.step, cost, trained, interval)
            return  # neither series nor the budget act on it
        sample.overhead_s = cost
        if trained is not None:
            sample.overhead_ratio = cost / self._interval_seconds(sample.step, trained, interval)

    def _interval_seconds(self, step: int, trained: float, interval: int) -> float:
        """The training seconds a sample at ``step`` is charged against: ``trained``, the training time since the
        previous sample ended, stretched to a full ``interval`` at the same pace when the sample came fewer steps
        after the previous one (the closing sample of `finish`, an explicit `sample`): the series stays the cost of
        sampling every ``interval`` steps instead of jumping by the interval over the steps at the closing sample."""
        steps = step - (self._last_end_step or 0)
        return trained * interval / steps if 0 < steps < interval else trained

    def fit(self, interval: int, ratio: float | None, budget: float, agree: Callable[[int], int]
            ) -> IntervalChange | None:
        """The change of ``interval`` a sample's overhead ``ratio`` asks for under ``budget`` (``overhead_budget``),
        or None: stretched (or shortened, with hysteresis: only to half or less) so the ratio stays under it, in
        multiples of ``every_n_steps``, at most `STRETCH_STEP` times longer per sample and never past `MAX_STRETCH`
        times ``every_n_steps``, so no single measurement (one stalled probe pass) can stop the sampling. A sample
        without a ratio (the first, or one whose clock readings were discarded) asks for no change. ``agree`` turns
        what this rank asks for into what the ranks agree on (under torch.distributed, the longest any rank asks
        for)."""
        base, wanted = self.every_n_steps, interval
        if ratio is not None and math.isfinite(ratio):
            needed = base * math.ceil(interval * ratio / budget / base)
            if needed > interval:
                wanted = min(needed, interval * STRETCH_STEP, base * MAX_STRETCH)
            elif needed <= interval // 2:
                wanted = max(base, needed)
        wanted = agree(wanted)
        return IntervalChange(wanted, interval, ratio, budget, base) if wanted != interval else None
