"""Cliff → Plateau → Climb segmentation of a per-layer curve, and plateau onset over training time.

A plateau that starts at block 0 has no Cliff before it: the first blocks barely change the curve and the change
comes later. That is a **slow start**, not the paper's Plateau (arXiv 2511.21635: a flat stretch *after* a Cliff,
where extra blocks add little); [`Phases.slow_start`][isiwatch.Phases.slow_start] tells them apart, and the Watch raises
``slow_start`` (info) for the one and ``plateau_onset`` (warning) for the other. Small models trained from scratch show
slow starts (benchmarks/RESULTS.md), not the paper's profile.

The curve is fitted by a continuous three-piece model — a line (Cliff), a constant (Plateau), a line
(Climb) — over every pair of plateau boundaries, by least squares. Continuity stops the outer pieces from
absorbing noisy points for free, which keeps the boundaries within ±1 layer at 5 % noise. A curve that a straight
line fits within the noise level (`LINE_NOISE` of its range, or ``min_range``) at every block has no phases. A
Cliff is steeper than the plateau after it (by ``slope_ratio``); a first piece that is not, or that drifts less
than ``flat_tolerance``, is no Cliff, and the flat stretch is sought from block 0 instead. The best fit is a plateau
only if it is long enough, really flat (its own free slope small against the slopes around it and its total drift
within ``flat_tolerance`` of the range) and explains the curve clearly better than a single straight line;
otherwise the curve has no plateau.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._utils.state import COUNT, SPAN, checked, is_count, optional
from .vocabulary import plateau_name

Span = tuple[int, int]

#: The noise the detector sees through, as a fraction of a curve's range: its boundaries are recovered within ±1
#: block on piecewise-linear curves with noise up to 5 % of their range (``tests/test_phases.py``), so a curve
#: within this distance of a straight line at every block is that line plus noise.
LINE_NOISE = 0.05

__all__ = ["LINE_NOISE", "Phases", "PlateauTracker", "detect_phases", "plateau_name", "spans_near"]


@dataclass(frozen=True)
class Phases:
    """Inclusive block-index spans; ``cliff``/``climb`` are None when the plateau touches that end."""

    plateau: Span
    cliff: Span | None
    climb: Span | None

    @property
    def length(self) -> int:
        return self.plateau[1] - self.plateau[0] + 1

    @property
    def slow_start(self) -> bool:
        """The plateau starts at block 0 (no Cliff before it): a slow start, not the paper's Plateau."""
        return self.cliff is None

    @property
    def plateau_name(self) -> str:
        """What the flat stretch is called in alerts, tables and plots: "slow start" or "plateau"."""
        return plateau_name(self.plateau)

    def to_dict(self) -> dict[str, Any]:
        return {"plateau": list(self.plateau), "cliff": list(self.cliff) if self.cliff else None,
                "climb": list(self.climb) if self.climb else None, "length": self.length}


def _sse(design: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    resid = y - design @ coef
    return float(resid @ resid), coef


def _free_slope(y: np.ndarray) -> float:
    i = np.arange(len(y), dtype=float)
    return float(np.polyfit(i, y, 1)[0])


def _best_fit(y: np.ndarray, starts: Iterable[int], min_layers: int, pin_end: bool = False
              ) -> tuple[float, int, int, np.ndarray]:
    """Least-squares continuous line–constant–line fit over plateau starts ``starts``."""
    n = len(y)
    i = np.arange(n, dtype=float)
    best = None
    for s in starts:
        ends = [n - 1] if pin_end else range(s + min_layers - 1, n)
        for e in ends:
            if e - s + 1 < min_layers:
                continue
            cols = [np.ones(n)]
            if s > 0:
                cols.append(np.minimum(i - s, 0.0))
            if e < n - 1:
                cols.append(np.maximum(i - e, 0.0))
            sse, coef = _sse(np.stack(cols, 1), y)
            if best is None or sse < best[0] - 1e-12:
                best = (sse, s, e, coef)
    if best is None:
        raise ValueError(f"no plateau of at least {min_layers} layers fits a curve of {n} points")
    return best


def detect_phases(
    curve: Sequence[float],
    *,
    min_layers: int = 3,
    flat_tolerance: float = 0.2,
    slope_ratio: float = 0.35,
    min_gain: float = 0.03,
    min_range: float = 0.0,
) -> Phases | None:
    """Segment ``curve`` (one value per block) into Cliff, Plateau and Climb.

    ``min_layers``: shortest plateau, in blocks. ``flat_tolerance``: the plateau's fitted drift end to end,
    as a fraction of the curve's range. ``slope_ratio``: the plateau's slope relative to the steeper of
    the neighbouring pieces, and at most relative to the Cliff's. ``min_gain``: how much more of the curve's
    variance the three-piece fit must explain than one straight line. ``min_range``: curves whose max − min is
    below this (in the metric's own units) count as flat — it keeps noise on an untrained model from reading as a
    profile — and departures from a straight line below it are noise (`LINE_NOISE`). Returns None for curves
    without a plateau (including flat ones and those a line fits within the noise); raises ValueError for curves
    shorter than 4 points or with NaN/Inf.
    """
    y = np.asarray(curve, dtype=float)
    if y.ndim != 1 or len(y) < 4:
        raise ValueError(f"detect_phases needs a 1-D curve of at least 4 points, got shape {y.shape}")
    if not np.all(np.isfinite(y)):
        raise ValueError("detect_phases: curve contains NaN or Inf")
    if min_layers < 2:
        raise ValueError(f"min_layers must be at least 2, got {min_layers}")
    lo, hi = float(y.min()), float(y.max())
    if hi - lo <= max(min_range, 1e-9 * max(1.0, abs(hi))):
        return None
    y = (y - lo) / (hi - lo)
    n = len(y)
    line = np.stack([np.ones(n), np.arange(n, dtype=float)], 1)
    line_sse, line_coef = _sse(line, y)
    if np.abs(y - line @ line_coef).max() <= max(LINE_NOISE, min_range / (hi - lo)):
        return None  # a straight line within the noise at every block: no phase to tell apart

    sse, s, e, coef = _best_fit(y, range(0, n - min_layers + 1), min_layers)
    # An outer piece that drifts less than the tolerance is part of the plateau, not a phase: refit without.
    if s > 0 and abs(coef[1]) * s <= flat_tolerance:
        sse, s, e, coef = _best_fit(y, [0], min_layers)
    elif e < n - 1 and abs(coef[-1]) * (n - 1 - e) <= flat_tolerance:
        sse, s, e, coef = _best_fit(y, range(0, n - min_layers + 1), min_layers, pin_end=True)
    mid_slope = abs(_free_slope(y[s:e + 1]))
    # Nor is a first piece no steeper than the plateau after it a Cliff (a curve that rises evenly, then faster):
    # refit with the flat stretch from block 0, keeping a plateau that reached the last block there.
    if s > 0 and mid_slope > slope_ratio * abs(coef[1]):
        sse, s, e, coef = _best_fit(y, [0], min_layers, pin_end=e == n - 1)
        mid_slope = abs(_free_slope(y[s:e + 1]))
    outer = [abs(c) for c in coef[1:]]
    flat = mid_slope * (e - s) <= flat_tolerance and (not outer or mid_slope <= slope_ratio * max(outer))
    gain = (line_sse - sse) / float(((y - y.mean()) ** 2).sum())
    if not flat or not outer or gain < min_gain:
        return None
    return Phases(plateau=(s, e), cliff=(0, s - 1) if s > 0 else None, climb=(e + 1, n - 1) if e < n - 1 else None)


def spans_near(a: Span, b: Span, tolerance: int) -> bool:
    return abs(a[0] - b[0]) <= tolerance and abs(a[1] - b[1]) <= tolerance


class PlateauTracker:
    """Plateau onset over training time: when a plateau has set in and stayed.

    Onset is the first sample at which a plateau has been present for ``patience`` consecutive samples
    with a stable span (within ±``span_tolerance`` layers of where the run started). Once onset has
    happened the plateau counts as present until it has been absent for ``patience`` samples. ``span`` is the
    last span that was stable for ``patience`` samples while onset holds (it says whether the plateau is a slow
    start or follows a Cliff, `plateau_name`).
    """

    def __init__(self, patience: int = 3, span_tolerance: int = 1):
        if patience < 1:
            raise ValueError(f"patience must be at least 1, got {patience}")
        self.patience = patience
        self.span_tolerance = span_tolerance
        self.anchor: Span | None = None
        self.run_length = 0
        self.absent = 0
        self.onset_step: int | None = None
        self.span: Span | None = None

    @property
    def active(self) -> bool:
        return self.onset_step is not None

    def update(self, step: int, phases: Phases | None) -> bool:
        """Feed one sample; True exactly when plateau onset happens at ``step``."""
        if phases is None:
            self.anchor, self.run_length = None, 0
            self.absent += 1
            if self.absent >= self.patience:
                self.onset_step, self.span = None, None
            return False
        self.absent = 0
        if self.anchor is not None and spans_near(phases.plateau, self.anchor, self.span_tolerance):
            self.run_length += 1
        else:
            self.anchor, self.run_length = phases.plateau, 1
        if self.run_length >= self.patience:
            self.span = self.anchor
        if self.onset_step is None and self.run_length >= self.patience:
            self.onset_step = step
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        return {"anchor": list(self.anchor) if self.anchor else None, "run_length": self.run_length,
                "absent": self.absent, "onset_step": self.onset_step, "span": list(self.span) if self.span else None}

    def load_state_dict(self, state: Mapping[str, Any], where: str = "PlateauTracker state") -> None:
        s = checked(state, where, anchor=SPAN, run_length=COUNT, absent=COUNT,
                    onset_step=(optional(is_count), "null or an int >= 0"))
        self.anchor = tuple(s["anchor"]) if s["anchor"] else None
        self.run_length, self.absent, self.onset_step = s["run_length"], s["absent"], s["onset_step"]
        span = checked(state, where, span=SPAN)["span"] if "span" in state else None
        # states saved before ``span`` existed: the plateau onset was found on is the anchor, when there is one
        self.span = tuple(span) if span else (self.anchor if self.onset_step is not None else None)
