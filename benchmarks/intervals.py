"""Means with 95 % Student-t intervals over seeds, and their text in the benchmarks' tables (shared by the scripts)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

#: Two-sided 95 % Student-t quantiles to three digits by number of values; ``bench_specialize`` uses them.
T95 = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365, 9: 2.306, 10: 2.262}


def t95(n: int) -> float:
    """The two-sided 95 % Student-t quantile for ``n`` values (n − 1 degrees of freedom)."""
    from scipy import stats

    return float(stats.t.ppf(0.975, n - 1))


def t95_table(n: int) -> float:
    """:data:`T95`'s quantile for ``n`` values; the normal's 1.96 beyond ten."""
    return T95.get(n, 1.96)


def mean_ci(values: Sequence[float], quantile: Callable[[int], float] = t95,
            single: float | None = None) -> tuple[float, float | None]:
    """Mean and half-width of the 95 % interval; with one value the half-width is ``single`` (None: JSON has no
    NaN)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, single
    return mean, quantile(len(values)) * statistics.stdev(values) / math.sqrt(len(values))


def fmt_ci(pair: Sequence, signed: bool = False, scale: float = 100.0, digits: int = 1, unit: str = "") -> str:
    """A (mean, half-width) pair as ``mean ± half`` times ``scale`` (100: points), without ``± half`` when it is
    None."""
    mean, half = pair
    text = f"{scale * mean:{'+' if signed else ''}.{digits}f}{unit}"
    return text + (f" ± {scale * half:.{digits}f}" if half is not None else "")


def fmt(values: Sequence[float], signed: bool = False, scale: float = 100.0, digits: int = 1, **interval) -> str:
    """``values`` times ``scale`` as mean ± 95 % half-width; ``interval`` goes to :func:`mean_ci`."""
    return fmt_ci(mean_ci([scale * v for v in values], **interval), signed, 1.0, digits)
