"""How ``truncate --strategy auto`` repairs and scores each candidate cut: `CandidateScorer`, the ``blocks_for`` and
``score`` that `CutSearch` walks its fixed order with. The benchmarks measure this same scorer, overriding only
where a cut's healing and its validation predictions come from (`CandidateScorer.healer`,
`CandidateScorer.correct`)."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from .confidence import AcceptanceRule, PairedDrop
from .healing import Images, predict
from .search import Score
from .strategies import STRATEGIES, CutInputs, choose_blocks
from .surgery import CutRepair, RepairChoice

__all__ = ["CandidateScorer"]


class CandidateScorer:
    """The cuts of a ``depth``-block model that ``auto`` tests and how each is scored.

    ``blocks_for`` cuts by a strategy from what was measured on the uncut model (``inputs``; None where the
    strategy's inputs are missing, e.g. ``plateau`` without a plateau). ``score`` repairs a cut as ``repair``
    chooses on the healing images (`CutRepair.choose`: as it is, bridged, or healed in full, ``heal_steps``
    optimizer steps by ``heal(model, steps)``) and compares it, image by image, with the uncut model on the
    validation images (``uncut_correct``: which of them the uncut model classifies right; ``validation``: those
    images and labels). ``rule`` is the one rule the search judges every candidate by.
    """

    def __init__(self, depth: int, inputs: CutInputs, repair: CutRepair, rule: AcceptanceRule,
                 uncut_correct: Tensor, heal_steps: int, heal: Callable[[nn.Module, int], int],
                 validation: tuple[Images, Tensor] | None = None):
        self.depth, self.inputs, self.repair, self.rule = depth, inputs, repair, rule
        self.uncut_correct, self.heal_steps, self.heal = uncut_correct, heal_steps, heal
        self.validation = validation

    def blocks_for(self, strategy: str, keep: int) -> list[int] | None:
        """The ``keep`` blocks ``strategy`` keeps; None when the strategy does not apply (inputs missing)."""
        if STRATEGIES[strategy].missing(self.inputs):
            return None
        return choose_blocks(strategy, self.depth, keep, phases=self.inputs.phases, distances=self.inputs.distances,
                             seed=self.inputs.seed)

    def healer(self, kept: list[int]) -> Callable[[nn.Module], int]:
        """`CutRepair.choose`'s ``heal`` for the cut keeping ``kept``: heals a copy of it in place, returns the
        steps taken."""
        return lambda model: self.heal(model, self.heal_steps)

    def correct(self, kept: list[int], repaired: RepairChoice | None) -> Tensor:
        """Which validation images the cut keeping ``kept`` classifies right, repaired as ``repaired`` says (None:
        the cut as it is)."""
        assert self.validation is not None, "a scorer without validation images overrides correct()"
        images, labels = self.validation
        model = repaired.model if repaired is not None else self.repair.variants(kept)["cut"][0]
        return predict(model, images) == labels

    def score(self, strategy: str, kept: list[int], may_heal: bool) -> Score:
        """Repair the cut keeping ``kept`` (healing it only when ``may_heal``) and score it on validation: its
        accuracy before and after the repair and its paired drop against the uncut model."""
        heal = self.healer(kept) if may_heal and self.heal_steps > 0 else None
        choice = self.repair.choose(kept, self.rule, len(self.uncut_correct), heal)
        correct = self.correct(kept, choice)
        before = self.correct(kept, None) if choice.steps else correct
        return Score(float(before.float().mean()), float(correct.float().mean()),
                     PairedDrop.from_correct(self.uncut_correct.tolist(), correct.tolist()), choice.steps,
                     choice.repair, choice.record, choice.bridge, choice.model)
