"""Early-stopping policies. `EarlyStopping` applies the rule of Lightning's ``EarlyStopping``
(``_evaluate_stopping_criteria``) to one value per sampling step; `PlateauStopping` is isiwatch's own.

Each policy sees one value (or sample) per sampling step and returns the reason to stop, or None.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .._utils.state import COUNT, NUMBER, checked, is_number, is_span, optional
from ..measure.phases import Phases, Span, spans_near


class EarlyStopping:
    """Stop when ``monitor`` stops improving, crosses a threshold, diverges or turns non-finite.

    The rule is Lightning 2.6's ``EarlyStopping._evaluate_stopping_criteria``, checked in this order:

    1. ``check_finite`` and the value is NaN or ±inf: stop.
    2. ``stopping_threshold`` set and the value is better than it (``<`` in mode "min", ``>`` in "max"): stop.
    3. ``divergence_threshold`` set and the value is worse than it: stop.
    4. The value beats ``best`` by more than ``min_delta`` (mode "min": ``value + min_delta < best``;
       "max": ``value - min_delta > best``): it becomes ``best`` and the wait restarts.
    5. Otherwise the wait grows by one; stop once it reaches ``patience`` (so ``patience=0`` stops at the
       first value that is not an improvement).

    As in Lightning, ``min_delta`` keeps its sign (a negative one lets values up to ``|min_delta|`` worse
    than ``best`` count as improvements), and with ``check_finite=False`` a non-finite value goes through
    the same comparisons: NaN compares false everywhere, so it counts as no improvement; in mode "min"
    ``+inf`` trips ``divergence_threshold`` (else counts as no improvement) and ``-inf`` trips
    ``stopping_threshold`` or becomes ``best`` (mode "max": the mirror image). ``load_state_dict``
    restores ``best``, the wait and ``patience`` (Lightning restores the saved patience too).

    Deliberate differences from Lightning:

    - ``warmup`` is isiwatch's own option, not Lightning's: the first ``warmup`` values are ignored
      entirely (no finiteness check, no threshold, no wait). Lightning has no such option.
    - A missing value (``None``: the monitored series does not exist in this sample, e.g.
      ``plateau/length`` while there is no plateau) is skipped, as Lightning does with ``strict=False``;
      a monitor that is no series at all is refused when the Watch is built, not at the first check.
    - Values are compared as Python floats (float64); Lightning compares the logged tensor (often
      float32), so values within float32 rounding of ``best`` or a threshold can be decided differently.
    """

    def __init__(self, monitor: str, mode: str = "min", min_delta: float = 0.0, patience: int = 3,
                 warmup: int = 0, check_finite: bool = True, stopping_threshold: float | None = None,
                 divergence_threshold: float | None = None):
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self.monitor, self.mode, self.min_delta = monitor, mode, float(min_delta)
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
        if self.check_finite and not math.isfinite(value):
            return f"{self.monitor} = {value} is not finite"
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

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "wait": self.wait, "seen": self.seen, "patience": self.patience}

    def load_state_dict(self, state: Mapping[str, Any], where: str = "EarlyStopping state") -> None:
        """Restore `state_dict`'s output. ``patience`` comes from the state, as in Lightning; a state
        saved before isiwatch recorded it keeps this instance's patience."""
        checks = {"best": NUMBER, "wait": COUNT, "seen": COUNT}
        if isinstance(state, dict) and "patience" in state:
            checks["patience"] = COUNT
        s = checked(state, where, **checks)
        self.best, self.wait, self.seen = float(s["best"]), s["wait"], s["seen"]
        self.patience = s.get("patience", self.patience)


class PlateauStopping:
    """``on_plateau``: stop once the plateau span (±``span_tolerance`` layers) and the last-layer probe
    accuracy (±``accuracy_tolerance``) have both been stable for ``patience`` samples. Only the paper's plateau
    (after a Cliff) counts: a slow start (flat from block 0) says the first blocks have not learned yet, which is
    no reason to stop."""

    def __init__(self, patience: int = 3, span_tolerance: int = 1, accuracy_tolerance: float = 0.01):
        self.patience, self.span_tolerance, self.accuracy_tolerance = patience, span_tolerance, accuracy_tolerance
        self.anchor: tuple[Span, float] | None = None
        self.stable = 0

    def update(self, phases: Phases | None, accuracy: float | None) -> str | None:
        if phases is None or phases.slow_start or accuracy is None or not math.isfinite(accuracy):
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

    def state_dict(self) -> dict[str, Any]:
        anchor = None if self.anchor is None else [list(self.anchor[0]), self.anchor[1]]
        return {"anchor": anchor, "stable": self.stable}

    def load_state_dict(self, state: Mapping[str, Any], where: str = "PlateauStopping state") -> None:
        anchor = (optional(lambda a: isinstance(a, (list, tuple)) and len(a) == 2 and is_span(a[0])
                           and is_number(a[1])), "null or [[start, end], accuracy]")
        s = checked(state, where, anchor=anchor, stable=COUNT)
        a = s["anchor"]
        self.anchor = None if a is None else (tuple(a[0]), float(a[1]))
        self.stable = s["stable"]
