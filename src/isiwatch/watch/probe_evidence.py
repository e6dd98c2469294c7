"""When one probe is better than another beyond the probes' own noise: the exact paired test on their held-out
predictions and the hysteresis the Watch's probe comparisons share (the ``cls_marginalized`` alert and the
published depth, `isiwatch.watch.published_depth`).

Two probes classify the same held-out images, so the comparison is paired, as truncate's
(`isiwatch.truncation.confidence`): only the discordant images count, ``only_first`` (the first probe right, the
second wrong) and ``only_second``. Were the two probes equally accurate, each discordant image would be of either
kind with chance 1/2; the second is better at ``confidence`` when its share of the discordant images is
significantly above 1/2: McNemar's exact test, one-sided, decided by the bound truncate certifies with (the
Clopper–Pearson lower bound of ``only_second / discordant`` above 1/2, `above_chance`, which is the exact binomial
p-value below 1 − confidence).

The hysteresis (`holds`): the state "the second probe is better" (an open ``cls_marginalized`` episode, the deeper
of two depths published) is entered only when the test says so at ``confidence``, and left only when the second
probe is not observed better at all (``only_second <= only_first``). In between the state stays as it was: a
borderline comparison (9 against 8 right of 38) never enters it, and one image changing sides does not leave it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..measure.binomial import above_chance

__all__ = ["PairedProbes", "holds"]


@dataclass(frozen=True)
class PairedProbes:
    """Two probes on the same held-out images: how many ``both`` classify correctly, ``only_first``,
    ``only_second`` and ``neither``."""

    both: int
    only_first: int
    only_second: int
    neither: int

    @classmethod
    def of(cls, first: Sequence[bool], second: Sequence[bool]) -> PairedProbes:
        """From the per-image correctness of the two probes (same images, same order)."""
        if len(first) != len(second):
            raise ValueError(f"{len(first)} and {len(second)} predictions: not the same held-out images")
        pairs = list(zip(first, second, strict=True))
        return cls(sum(a and b for a, b in pairs), sum(a and not b for a, b in pairs),
                   sum(b and not a for a, b in pairs), sum(not (a or b) for a, b in pairs))

    @property
    def images(self) -> int:
        return self.both + self.only_first + self.only_second + self.neither

    @property
    def p_value(self) -> float:
        """The one-sided exact (McNemar) p-value of "the second probe is better": the chance of at least
        ``only_second`` of the discordant images going to the second probe were each a fair coin (1 with none)."""
        from scipy.stats import binom

        return float(binom.sf(self.only_second - 1, self.only_first + self.only_second, 0.5))

    def second_better(self, confidence: float) -> bool:
        """Whether the second probe is more accurate at ``confidence`` (a fraction, below 1)."""
        discordant = self.only_first + self.only_second
        return discordant > 0 and above_chance(self.only_second, discordant, 0.5, 1 - confidence)

    def to_dict(self, first: str, second: str, confidence: float) -> dict[str, Any]:
        """The evidence, with the probes' names in the counts' keys (``only_<first>``, ``only_<second>``)."""
        return {"held_out": self.images, "both_correct": self.both, f"only_{first}": self.only_first,
                f"only_{second}": self.only_second, "neither": self.neither, "p_value": self.p_value,
                "confidence": confidence}


def holds(held: bool, pair: PairedProbes, confidence: float) -> bool:
    """Whether the state "the second probe is better" holds after ``pair``, given that it ``held`` before: entered
    only when the second is better at ``confidence``, left only when it is no longer observed better at all."""
    return pair.only_second > pair.only_first if held else pair.second_better(confidence)
