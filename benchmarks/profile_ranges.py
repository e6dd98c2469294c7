"""Seconds a piece of code spends in each of the Watch's ``torch.profiler`` ranges (host wall time per range)."""

from __future__ import annotations

from collections.abc import Callable

from torch.profiler import ProfilerActivity, profile

#: The Watch's ranges: a whole sample and, inside it, the probe forward, the metrics, the probes and the host read
#: (the metrics run inside the forward's hooks, so the forward's range holds part of them).
RANGES = ("isiwatch.sample", "isiwatch.forward", "isiwatch.metrics", "isiwatch.probes", "isiwatch.host")


def range_seconds(fn: Callable[[], object]) -> dict[str, float]:
    """Seconds spent in each of `RANGES` during one call of ``fn``, summed over the range's occurrences."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    totals = {name: 0.0 for name in RANGES}
    for event in prof.key_averages():
        if event.key in totals:
            totals[event.key] += event.cpu_time_total / 1e6
    return totals
