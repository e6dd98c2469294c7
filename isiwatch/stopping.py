"""Early-stopping policies, with the option names of Lightning's ``EarlyStopping``.

Each policy sees one value (or sample) per sampling step and returns the reason to stop, or None.
"""

from __future__ import annotations

import math

from .phases import Phases, Span, spans_near
from .state import COUNT, NUMBER, checked, is_number, is_span, optional


class EarlyStopping:
    """Stop when ``monitor`` stops improving, crosses a threshold, diverges or turns non-finite.

    ``mode``: "min" or "max". ``min_delta``: smallest change that counts as an improvement (absolute).
    ``patience``: samples without improvement before stopping. ``warmup``: samples ignored at the start.
    ``stopping_threshold``: stop as soon as the value is better than this. ``divergence_threshold``: stop
    as soon as it is worse than this. ``check_finite``: stop on NaN/Inf.
    """

    def __init__(self, monitor: str, mode: str = "min", min_delta: float = 0.0, patience: int = 3,
                 warmup: int = 0, check_finite: bool = True, stopping_threshold: float | None = None,
                 divergence_threshold: float | None = None):
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self.monitor, self.mode, self.min_delta = monitor, mode, abs(min_delta)
        self.patience, self.warmup, self.check_finite = patience, warmup, check_finite
        self.stopping_threshold, self.divergence_threshold = stopping_threshold, divergence_threshold
        self.best = math.inf if mode == "min" else -math.inf
        self.wait = 0
        self.seen = 0

    def _better(self, a: float, b: float) -> bool:
        return a < b if self.mode == "min" else a > b

    def update(self, value: float | None) -> str | None:
        if value is None:
            return None
        self.seen += 1
        if self.seen <= self.warmup:
            return None
        if not math.isfinite(value):
            return f"{self.monitor} = {value} is not finite" if self.check_finite else None
        if self.stopping_threshold is not None and self._better(value, self.stopping_threshold):
            return f"{self.monitor} = {value:.4g} reached the stopping threshold {self.stopping_threshold}"
        if self.divergence_threshold is not None and self._better(self.divergence_threshold, value):
            return f"{self.monitor} = {value:.4g} diverged past {self.divergence_threshold}"
        shifted = value + self.min_delta if self.mode == "min" else value - self.min_delta
        if self._better(shifted, self.best):
            self.best, self.wait = value, 0
            return None
        self.wait += 1
        if self.wait >= self.patience:
            return f"{self.monitor} did not improve for {self.wait} samples (best {self.best:.4g})"
        return None

    def state_dict(self) -> dict:
        return {"best": self.best, "wait": self.wait, "seen": self.seen}

    def load_state_dict(self, state: dict, where: str = "EarlyStopping state") -> None:
        s = checked(state, where, best=NUMBER, wait=COUNT, seen=COUNT)
        self.best, self.wait, self.seen = float(s["best"]), s["wait"], s["seen"]


class PlateauStopping:
    """``on_plateau``: stop once the plateau span (±``span_tolerance`` layers) and the last-layer probe
    accuracy (±``accuracy_tolerance``) have both been stable for ``patience`` samples."""

    def __init__(self, patience: int = 3, span_tolerance: int = 1, accuracy_tolerance: float = 0.01):
        self.patience, self.span_tolerance, self.accuracy_tolerance = patience, span_tolerance, accuracy_tolerance
        self.anchor: tuple[Span, float] | None = None
        self.stable = 0

    def update(self, phases: Phases | None, accuracy: float | None) -> str | None:
        if phases is None or accuracy is None or not math.isfinite(accuracy):
            self.anchor, self.stable = None, 0
            return None
        if (self.anchor is not None and spans_near(phases.plateau, self.anchor[0], self.span_tolerance)
                and abs(accuracy - self.anchor[1]) <= self.accuracy_tolerance):
            self.stable += 1
        else:
            self.anchor, self.stable = (phases.plateau, accuracy), 1
        if self.stable >= self.patience:
            s, e = phases.plateau
            return (f"plateau {s}–{e} and last-layer probe accuracy {accuracy:.3f} stable for "
                    f"{self.stable} samples")
        return None

    def state_dict(self) -> dict:
        anchor = None if self.anchor is None else [list(self.anchor[0]), self.anchor[1]]
        return {"anchor": anchor, "stable": self.stable}

    def load_state_dict(self, state: dict, where: str = "PlateauStopping state") -> None:
        anchor = (optional(lambda a: isinstance(a, (list, tuple)) and len(a) == 2 and is_span(a[0])
                           and is_number(a[1])), "null or [[start, end], accuracy]")
        s = checked(state, where, anchor=anchor, stable=COUNT)
        a = s["anchor"]
        self.anchor = None if a is None else (tuple(a[0]), float(a[1]))
        self.stable = s["stable"]
