"""``truncate --strategy auto``: the cheapest healed cut whose accuracy drop is certified within ``max_drop``.

Candidates are cuts (strategy, kept blocks). Each is *screened*: cut, healed with a short budget of optimizer
steps and scored on a validation split that healing never sees, paired image by image with the uncut model. A
candidate *qualifies* when the `AcceptanceRule` accepts its paired drop
(the upper confidence bound of the drop within ``max_drop``, Bonferroni-corrected for every bound the search
may compute; at confidence 0 the observed drop).

The search moves along K, the number of blocks kept, with the best strategy (the first of
`AUTO_STRATEGIES` that applies, ``bi``): bisection over K, starting at the
recommended depth when there is one ([`recommend_depth`][isiwatch.recommend_depth]) — bisection assumes that
keeping more blocks never hurts, which holds for healed cuts up to noise. Only then, just below the cheapest K
found, it tries the other strategies, where they can change the answer, and keeps going down while one
qualifies. ``budget`` caps the candidates screened. The winner is the qualifying candidate with the fewest
blocks (ties: the higher validation accuracy), or none; the caller heals it fully
(`isiwatch.truncation.truncate.auto_cut`).

Each finished candidate goes to a `SearchJournal`, so that a resumed search
takes it from there instead of healing it again. This module imports neither torch nor timm.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from .confidence import AcceptanceRule, PairedDrop
from .journal import SearchJournal
from .strategies import AUTO_STRATEGIES

__all__ = ["BudgetExhausted", "Candidate", "CutSearch", "Score", "SearchProgress"]


@dataclass
class Score:
    """What healing and scoring one cut gave: validation accuracy before and after healing, the paired
    comparison with the uncut model after it, the optimizer steps and the healed model."""

    cut_accuracy: float
    healed_accuracy: float
    drop: PairedDrop
    steps: int
    model: object = None


@dataclass
class Candidate:
    """One screened cut: validation accuracy before (``cut``) and after (``healed``) healing, its paired drop,
    the drop's upper bound (a fraction) and whether it qualifies; ``resumed``: read back from a journal."""

    strategy: str
    kept: list[int]
    cut: float
    healed: float
    drop: PairedDrop
    bound: float
    qualifies: bool
    healing_steps: int
    resumed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def keep(self) -> int:
        return len(self.kept)

    def to_dict(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "keep": self.keep, "kept_blocks": self.kept,
                "validation_accuracy": {"cut": self.cut, "healed": self.healed},
                "validation_drop": {"points": 100 * self.drop.drop, "upper_bound_points": 100 * self.bound,
                                    **self.drop.to_dict()},
                "qualifies": self.qualifies, "healing_steps": self.healing_steps, "resumed": self.resumed,
                **self.extra}

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> Candidate:
        """A journalled candidate (`to_dict` without ``extra``), marked ``resumed``."""
        drop = record["validation_drop"]
        return cls(record["strategy"], list(record["kept_blocks"]), record["validation_accuracy"]["cut"],
                   record["validation_accuracy"]["healed"],
                   PairedDrop(drop["images"], drop["uncut_only"], drop["cut_only"]), drop["upper_bound_points"] / 100,
                   record["qualifies"], record["healing_steps"], resumed=True)


class BudgetExhausted(Exception):
    """No candidate may be screened any more."""


class SearchProgress:
    """One bar over every healing step the search may take (the screens of its budget and the winner's full
    heal), with an ETA; shown only when asked and standard error is a terminal."""

    def __init__(self, total_steps: int, candidates: int, enabled: bool):
        self.candidates = candidates
        self.bar = tqdm(total=total_steps, desc="auto search", unit="step", leave=False,
                        disable=not (enabled and sys.stderr.isatty()))

    @property
    def shown(self) -> bool:
        return not self.bar.disable

    def advance(self, steps: int, done: int, note: str) -> None:
        """``steps`` more healing steps done; ``done`` candidates so far; ``note`` what the last one was."""
        self.bar.update(steps)
        self.bar.set_postfix_str(f"candidate {done}/{self.candidates}: {note}")

    def close(self) -> None:
        self.bar.close()


class CutSearch:
    """Screens candidates through ``heal_and_score(strategy, kept) -> Score`` and
    ``blocks_for(strategy, keep) -> kept | None`` (None: the strategy does not apply), judged by ``rule``."""

    def __init__(self, depth: int, rule: AcceptanceRule, budget: int,
                 blocks_for: Callable[[str, int], list[int] | None],
                 heal_and_score: Callable[[str, list[int]], Score],
                 journal: SearchJournal | None = None, progress: SearchProgress | None = None):
        if budget < 1:
            raise ValueError(f"budget must be at least 1 candidate, got {budget}")
        self.depth, self.rule, self.budget = depth, rule, budget
        self.blocks_for, self.heal_and_score = blocks_for, heal_and_score
        self.journal = journal if journal is not None else SearchJournal(None, {})
        self.progress = progress
        self.candidates: list[Candidate] = []
        self.best_model: object = None  # the screened model of winner(), when this run healed it

    def evaluate(self, strategy: str, kept: list[int]) -> Candidate:
        """Screen one cut (a cut already tried, here or by the journalled run, is not healed again)."""
        known = next((c for c in self.candidates if c.kept == kept), None)
        if known is not None:
            return known
        if len(self.candidates) >= self.budget:
            raise BudgetExhausted
        record = self.journal.lookup(kept)
        model = None
        if record is not None:
            candidate = Candidate.from_dict(record)
        else:
            score = self.heal_and_score(strategy, kept)
            bound = self.rule.bound(score.drop)
            candidate = Candidate(strategy, kept, score.cut_accuracy, score.healed_accuracy, score.drop, bound,
                                  self.rule.qualifies(score.drop), score.steps)
            self.journal.record(candidate.to_dict())
            model = score.model
        self.candidates.append(candidate)
        if candidate is self.winner():
            self.best_model = model
        if self.progress is not None:
            self.progress.advance(0 if candidate.resumed else candidate.healing_steps, len(self.candidates),
                                  f"{strategy} K={len(kept)} bound {100 * candidate.bound:.2f} points")
        return candidate

    def _qualifies(self, strategy: str, keep: int) -> bool:
        kept = self.blocks_for(strategy, keep)
        return kept is not None and self.evaluate(strategy, kept).qualifies

    def run(self, start: int | None = None) -> Candidate | None:
        """Search from K = ``start`` (None or outside 1..depth-1: the middle); the winner."""
        applicable = [s for s in AUTO_STRATEGIES if self.blocks_for(s, 1) is not None]
        low, high = 1, self.depth  # the primary's cheapest qualifying K lies in [low, high]; depth: no cut
        probe = start if start is not None and 1 <= start < self.depth else None
        try:
            while low < high:
                middle = probe if probe is not None else (low + high) // 2
                probe = None
                if self._qualifies(applicable[0], middle):
                    high = middle
                else:
                    low = middle + 1
            keep = high - 1  # the primary failed here (or K = depth - 1 was never cut): the others may not
            while keep >= 1 and any(self._qualifies(s, keep) for s in applicable):
                keep -= 1
        except BudgetExhausted:
            pass
        return self.winner()

    def winner(self) -> Candidate | None:
        qualifying = [c for c in self.candidates if c.qualifies]
        return min(qualifying, key=lambda c: (c.keep, -c.healed)) if qualifying else None

    def closest(self) -> Candidate | None:
        """The candidate nearest to qualifying (smallest bound; ties: fewer blocks), for a no-cut message."""
        return min(self.candidates, key=lambda c: (c.bound, c.keep)) if self.candidates else None
