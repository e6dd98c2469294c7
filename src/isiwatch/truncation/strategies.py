"""``truncate --strategy auto``: the cheapest healed cut within a stated accuracy loss.

Candidates are cuts (strategy, kept blocks). Each is healed with the normal budget and scored on a
validation split that healing never sees; a candidate *qualifies* when its validation accuracy is at most
``max_drop`` points below the uncut model's. The search starts from the depth recommendation
(:func:`isiwatch.measure.depth.recommend_depth`): if that cut qualifies it looks for fewer blocks, otherwise for
more, by bisection over the number of kept blocks K. At each K it tries :data:`AUTO_STRATEGIES` in turn and
stops at the first that qualifies (K is feasible) — bisection assumes that keeping more blocks never hurts,
which holds for healed cuts up to noise. ``budget`` caps the number of candidates healed. The winner is the
qualifying candidate with the fewest blocks (ties: the higher validation accuracy), or none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

#: Every fixed cut strategy (``isiwatch.truncation.truncate`` implements them; they live here, in a module free of
#: timm, so the command line can offer them without importing it).
STRATEGIES = ("plateau", "tail", "bi", "angular", "random")
#: Chosen from the evaluation in ``benchmarks/RESULTS.md``: block influence had the highest mean healed accuracy
#: over all paired comparisons (ahead of ``tail`` by less than the noise); the plateau cut lost to both.
DEFAULT_STRATEGY = "bi"
#: Strategies tried at each K, in order (plateau only where the curve has one).
AUTO_STRATEGIES = ("bi", "angular", "tail", "plateau")
#: Defaults: accuracy loss allowed (points) and candidates healed at most.
DEFAULT_MAX_DROP = 1.0
DEFAULT_BUDGET = 16
#: Healing defaults: a short fine-tune of already trained weights.
HEAL_EPOCHS = 2
HEAL_LR = 1e-3


@dataclass
class Candidate:
    """One healed cut: validation accuracy before (``cut``) and after (``healed``) healing."""

    strategy: str
    kept: list[int]
    cut: float
    healed: float
    qualifies: bool
    healing_steps: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def keep(self) -> int:
        return len(self.kept)

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "keep": self.keep, "kept_blocks": self.kept,
                "validation_accuracy": {"cut": self.cut, "healed": self.healed}, "qualifies": self.qualifies,
                "healing_steps": self.healing_steps, **self.extra}


def check_search_options(max_drop: float, budget: int) -> None:
    """One-line errors for an impossible request, before any work."""
    if not max_drop >= 0:
        raise ValueError(f"--max-drop must be at least 0 points, got {max_drop}")
    if budget < 1:
        raise ValueError(f"--budget must be at least 1 candidate, got {budget}")


class BudgetExhausted(Exception):
    """No candidate may be healed any more."""


class CutSearch:
    """Evaluates candidates through ``heal_and_score(strategy, kept) -> (cut, healed, steps, model)`` and
    ``blocks_for(strategy, keep) -> kept | None`` (None: the strategy does not apply)."""

    def __init__(self, depth: int, reference: float, max_drop: float, budget: int,
                 blocks_for: Callable[[str, int], list[int] | None],
                 heal_and_score: Callable[[str, list[int]], tuple[float, float, int, object]],
                 progress: bool = False):
        check_search_options(max_drop, budget)
        self.depth, self.reference, self.max_drop, self.budget = depth, reference, max_drop, budget
        self.blocks_for, self.heal_and_score = blocks_for, heal_and_score
        self.candidates: list[Candidate] = []
        self.best_model: object | None = None  # the healed model of winner(): only one healed model is held at a time
        self._bar = tqdm(total=budget, desc="candidates", disable=not progress, leave=False)

    def evaluate(self, strategy: str, kept: list[int]) -> Candidate:
        """Heal and score one cut (a cut already tried with another strategy is not healed again)."""
        known = next((c for c in self.candidates if c.kept == kept), None)
        if known is not None:
            return known
        if len(self.candidates) >= self.budget:
            raise BudgetExhausted
        cut, healed, steps, model = self.heal_and_score(strategy, kept)
        candidate = Candidate(strategy, kept, cut, healed, healed >= self.reference - self.max_drop / 100, steps)
        self.candidates.append(candidate)
        if candidate is self.winner():
            self.best_model = model
        self._bar.update(1)
        self._bar.set_postfix(K=len(kept), strategy=strategy, acc=f"{healed:.3f}")
        return candidate

    def feasible(self, keep: int) -> bool:
        for strategy in AUTO_STRATEGIES:
            kept = self.blocks_for(strategy, keep)
            if kept is not None and self.evaluate(strategy, kept).qualifies:
                return True
        return False

    def run(self, recommended: list[int] | None) -> Candidate | None:
        """Search from the recommended kept blocks (None or all blocks: no recommendation); the winner."""
        low, high = 1, self.depth  # the answer lies in [low, high]; high = depth means "no cut"
        try:
            if recommended is not None and len(recommended) < self.depth:
                if self.evaluate("recommended", recommended).qualifies:
                    high = len(recommended)
                else:
                    low = len(recommended) + 1
            while low < high:
                middle = (low + high) // 2
                if self.feasible(middle):
                    high = middle
                else:
                    low = middle + 1
        except BudgetExhausted:
            pass
        finally:
            self._bar.close()
        return self.winner()

    def winner(self) -> Candidate | None:
        qualifying = [c for c in self.candidates if c.qualifies]
        return min(qualifying, key=lambda c: (c.keep, -c.healed)) if qualifying else None
