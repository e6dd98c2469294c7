"""When a cut "stays within ``max_drop``": an exact upper confidence bound on its paired accuracy drop.

The uncut and the cut model are scored on the same validation images, so the comparison is paired: only the
*discordant* images count — ``uncut_only`` (the uncut model right, the cut wrong) and ``cut_only`` (the other
way round). The true drop is ``p_uncut_only − p_cut_only``. Its bound is the one-sided Clopper–Pearson upper
bound of ``uncut_only / images`` at level α/2 minus the Clopper–Pearson lower bound of ``cut_only / images``
at level α/2: each count is binomial on its own, so by Bonferroni both hold together with probability at least
1 − α, and then the drop is below their difference. The bound is exact (never below its nominal coverage,
whatever the true rates) and conservative.

A search tests many candidates and keeps the cheapest that qualifies, so the chance that *any* qualifying
candidate's true drop exceeds ``max_drop`` (the family-wise error) must stay at most 1 − confidence.
`SearchGuarantee` controls it by fixed-sequence testing (the Learn-then-Test framework, Angelopoulos et al. 2021):
the candidates — each cut together with the repair it will be tested with — are put in an order fixed before any
validation image is seen, each is tested at the whole level α = 1 − confidence, and the sequence stops at its first
candidate that does not qualify; the qualifying ones are the prefix before it. The sequence rejects a true null (a
candidate whose true drop exceeds ``max_drop``) only by rejecting its first true null, which happens with
probability at most α, so the search errs at most that often, whatever its length, and any choice among its
qualifying candidates is certified. A repair (bridge, heal) is chosen on healing images only, so it is part of the
fixed order and costs none of α; the model tested is the model written. ``confidence`` 0 is the plain point
estimate (the validation drop itself).

Imports only the standard library and, for the beta quantiles, SciPy (loaded when a bound is computed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._utils.wording import points
from ..measure.binomial import clopper_pearson_lower, clopper_pearson_upper

__all__ = ["AcceptanceRule", "PairedDrop", "SearchGuarantee", "upper_bound"]


@dataclass(frozen=True)
class PairedDrop:
    """The paired comparison of an uncut and a cut model on the same ``images``: how many only the uncut model
    classifies correctly (``uncut_only``) and how many only the cut one does (``cut_only``)."""

    images: int
    uncut_only: int
    cut_only: int

    def __post_init__(self) -> None:
        if self.images < 1 or min(self.uncut_only, self.cut_only) < 0 or self.uncut_only + self.cut_only > self.images:
            raise ValueError(f"not a paired comparison: {self.uncut_only} + {self.cut_only} discordant of "
                             f"{self.images} images")

    @classmethod
    def from_correct(cls, uncut_correct: Sequence[bool], cut_correct: Sequence[bool]) -> PairedDrop:
        """From per-image correctness of the uncut and the cut model (same images, same order)."""
        if len(uncut_correct) != len(cut_correct):
            raise ValueError(f"{len(uncut_correct)} uncut but {len(cut_correct)} cut scores: not the same images")
        pairs = list(zip(map(bool, uncut_correct), map(bool, cut_correct), strict=True))
        return cls(len(pairs), sum(u and not c for u, c in pairs), sum(c and not u for u, c in pairs))

    @property
    def drop(self) -> float:
        """The observed accuracy drop (a fraction; negative when the cut model is better)."""
        return (self.uncut_only - self.cut_only) / self.images

    def scaled(self, images: int) -> PairedDrop:
        """The comparison on ``images`` images at this one's shares of discordant images (rounded)."""
        return PairedDrop(images, round(self.uncut_only * images / self.images),
                          round(self.cut_only * images / self.images))

    def to_dict(self) -> dict[str, int]:
        return {"images": self.images, "uncut_only": self.uncut_only, "cut_only": self.cut_only}


def upper_bound(pair: PairedDrop, alpha: float) -> float:
    """An upper bound on the true accuracy drop (a fraction) that holds with probability at least ``1 − alpha``
    (see the module docstring); ``alpha`` 1 or more: the observed drop."""
    if alpha >= 1:
        return pair.drop
    if not 0 < alpha:
        raise ValueError(f"alpha must be above 0, got {alpha}")
    return (clopper_pearson_upper(pair.uncut_only, pair.images, alpha / 2)
            - clopper_pearson_lower(pair.cut_only, pair.images, alpha / 2))


@dataclass(frozen=True)
class AcceptanceRule:
    """A candidate qualifies when the upper bound of its drop at error level ``alpha`` is at most ``max_drop``
    accuracy points; ``alpha`` 1: when the observed drop is (the point estimate)."""

    max_drop: float
    alpha: float

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise ValueError(f"alpha must be above 0 and at most 1, got {self.alpha}")

    def bound(self, pair: PairedDrop) -> float:
        """The drop's upper bound (a fraction; the observed drop at ``alpha`` 1)."""
        return upper_bound(pair, self.alpha)

    def qualifies(self, pair: PairedDrop) -> bool:
        # a hair of slack so that a drop of exactly max_drop points, computed in floating point, qualifies
        return self.bound(pair) <= self.max_drop / 100 + 1e-12

    def images_needed(self) -> int | None:
        """The fewest validation images on which a cut that changes no prediction at all qualifies; None when no
        number does (``max_drop`` 0 below ``alpha`` 1)."""
        if self.alpha >= 1 or self.max_drop >= 100:
            return 1
        if self.max_drop <= 0:
            return None
        n = max(1, math.ceil(math.log(self.alpha / 2) / math.log1p(-self.max_drop / 100)))
        while n > 1 and self.qualifies(PairedDrop(n - 1, 0, 0)):  # floating-point edges of the closed form
            n -= 1
        while not self.qualifies(PairedDrop(n, 0, 0)):
            n += 1
        return n

    def images_to_qualify(self, pair: PairedDrop) -> int | None:
        """The fewest validation images on which a cut with ``pair``'s rates of discordant images (the same
        share right only uncut, the same share right only cut) would qualify: what would certify a candidate
        that fell short; None when no number does (its observed drop is not below ``max_drop``)."""
        if self.qualifies(pair):
            return pair.images
        if self.alpha >= 1 or 100 * pair.drop >= self.max_drop:
            return None
        a, b = pair.uncut_only / pair.images, pair.cut_only / pair.images

        def ok(n: int) -> bool:
            return self.qualifies(PairedDrop(n, round(a * n), round(b * n)))

        low, high = pair.images, 2 * pair.images
        while not ok(high):  # the bound shrinks towards the observed drop, which is below max_drop
            low, high = high, 2 * high
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (low, mid) if ok(mid) else (mid, high)
        return high

    def to_dict(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "images_needed": self.images_needed()}


@dataclass(frozen=True)
class SearchGuarantee:
    """The error control of the auto search (see the module docstring): ``max_drop`` points at ``confidence``,
    the whole error 1 − confidence spent on one fixed sequence of candidates, each repaired before it is tested."""

    max_drop: float
    confidence: float

    def __post_init__(self) -> None:
        if not 0 <= self.confidence < 1:
            raise ValueError(f"confidence must be at least 0 and below 1, got {self.confidence}")

    @property
    def alpha(self) -> float:
        """The level every candidate of the sequence is tested at: 1 − confidence (1: the point estimate)."""
        return 1.0 if self.confidence == 0 else 1 - self.confidence

    @property
    def rule(self) -> AcceptanceRule:
        """The rule every candidate of the sequence is judged by."""
        return AcceptanceRule(self.max_drop, self.alpha)

    def images_needed(self) -> int | None:
        """The fewest validation images on which a cut that changes no prediction qualifies; None when no
        number does."""
        return self.rule.images_needed()

    def certifiable(self, images: int) -> bool:
        """Whether any cut can qualify on ``images`` validation images."""
        needed = self.images_needed()
        return needed is not None and images >= needed

    def describe(self) -> str:
        """When a cut qualifies, in the words every line that states the rule uses ("a cut qualifies when …")."""
        within = points(self.max_drop)
        if self.confidence == 0:
            return f"its validation drop (a point estimate) is within {within}"
        return (f"the upper {100 * self.confidence:g} % confidence bound of its validation drop (exact) is within "
                f"{within}, one sequence tested at alpha {self.alpha:g} in a fixed order from the fewest blocks "
                "dropped, stopping at its first failure")

    def to_dict(self) -> dict[str, Any]:
        return {"max_drop": self.max_drop, "confidence": self.confidence, "alpha": self.alpha,
                "method": "point estimate" if self.confidence == 0 else
                "Clopper-Pearson on each discordant count at alpha/2; one fixed sequence at the whole alpha",
                "images_needed": self.images_needed()}
