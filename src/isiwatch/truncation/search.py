"""``truncate --strategy auto``: the cheapest cut whose accuracy drop is certified within ``max_drop``.

Candidates are cuts (strategy, kept blocks) in one order fixed before any validation image is seen
(`CutSearch.fixed_order`): K, the number of blocks kept, from depth − 1 down to 1, each K cut by the primary
strategy (the first of `AUTO_STRATEGIES` that applies, ``bi``, whose ranking of the blocks is measured on
healing images). Dropping the least useful block first puts the cuts most likely to qualify first, which is
what gives fixed-sequence testing its power. The search walks that order twice, as the two sequences of
`SearchGuarantee`:

- *as cut*: each cut scored on the validation split as it is, paired image by image with the uncut model (no
  healing, so a cut that changes nothing, such as dropping an identity block, has no discordant image);
- *healed*: each cut *screened*, healed with a short budget of optimizer steps, then scored the same way;
  ``budget`` caps the candidates healed.

Each cut may be *bridged* first (`isiwatch.truncation.bridge`: a linear map fitted on healing images, no
training) when that agrees better with the uncut model on those images; the choice reads no validation image, so
it is part of the fixed order, and both sequences test the cut as chosen (its ``repair``: none, bridge, heal or
bridge+heal). The family of tests, and its error budget, is the same as without the bridge.

A sequence stops at its first candidate that does not *qualify* (the upper confidence bound of its drop above
``max_drop``; at confidence 0 the observed drop). The winner is the qualifying candidate with the fewest blocks
(ties: the higher validation accuracy), or none; the caller heals a screened winner fully
(`isiwatch.truncation.truncate.auto_cut`).

Each healed candidate goes to a `SearchJournal`, so that a resumed search takes it from there instead of
healing it again. This module imports neither torch nor timm.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from .confidence import PairedDrop, SearchGuarantee
from .journal import SearchJournal
from .strategies import AUTO_STRATEGIES

__all__ = ["Candidate", "CutSearch", "Score", "SearchProgress"]


@dataclass
class Score:
    """What repairing and scoring one cut gave: validation accuracy before and after its repair (the same for a
    cut scored as it is), the paired comparison with the uncut model after it, the optimizer steps (0: not
    healed), the scored model and its bridge's record (`BridgeFit.to_dict`; None: not bridged)."""

    cut_accuracy: float
    healed_accuracy: float
    drop: PairedDrop
    steps: int
    model: object = None
    bridge: dict[str, Any] | None = None

    def repair(self, healed: bool) -> str:
        """"none", "bridge", "heal" or "bridge+heal": what was done to the cut before it was scored."""
        return "+".join(n for n, done in (("bridge", self.bridge is not None), ("heal", healed)) if done) or "none"


@dataclass
class Candidate:
    """One scored cut: validation accuracy before (``cut``) and after (``healed``) its repair, its paired drop,
    the drop's upper bound (a fraction) and whether it qualifies; ``chain``: the sequence it was tested in
    ("cut": not healed, "healed": screened); ``repair`` (`Score.repair`) and ``bridge`` (its record, None: not
    bridged): what was done to it; ``resumed``: read back from a journal."""

    strategy: str
    kept: list[int]
    cut: float
    healed: float
    drop: PairedDrop
    bound: float
    qualifies: bool
    healing_steps: int
    chain: str = "healed"
    repair: str = "heal"
    bridge: dict[str, Any] | None = None
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
                "qualifies": self.qualifies, "chain": self.chain, "repair": self.repair,
                "healing_steps": self.healing_steps, "bridge": self.bridge, "resumed": self.resumed,
                **self.extra}

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> Candidate:
        """A journalled candidate (`to_dict` without ``extra``), marked ``resumed``."""
        drop = record["validation_drop"]
        return cls(record["strategy"], list(record["kept_blocks"]), record["validation_accuracy"]["cut"],
                   record["validation_accuracy"]["healed"],
                   PairedDrop(drop["images"], drop["uncut_only"], drop["cut_only"]), drop["upper_bound_points"] / 100,
                   record["qualifies"], record["healing_steps"], record["chain"], record["repair"], record["bridge"],
                   resumed=True)


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
    """Walks the fixed order of ``blocks_for(strategy, keep) -> kept | None`` (None: the strategy does not apply)
    as cuts and healed, through ``score(strategy, kept, heal) -> Score`` (``heal`` False: the cut as it is),
    each candidate judged by its sequence's rule of ``guarantee``; ``budget`` caps the candidates healed."""

    def __init__(self, depth: int, guarantee: SearchGuarantee, budget: int,
                 blocks_for: Callable[[str, int], list[int] | None],
                 score: Callable[[str, list[int], bool], Score],
                 journal: SearchJournal | None = None, progress: SearchProgress | None = None):
        if budget < 1:
            raise ValueError(f"budget must be at least 1 candidate, got {budget}")
        self.depth, self.guarantee, self.budget = depth, guarantee, budget
        self.blocks_for, self.score = blocks_for, score
        self.journal = journal if journal is not None else SearchJournal(None, {})
        self.progress = progress
        self.candidates: list[Candidate] = []
        self.best_model: object = None  # the scored model of winner(), when this run scored it

    def fixed_order(self) -> list[tuple[str, list[int]]]:
        """The candidates in testing order: K from depth − 1 down to 1, cut by the first of `AUTO_STRATEGIES`
        that applies; it reads only what ``blocks_for`` reads (the uncut model's healing images), never the
        validation images."""
        primary = next((s for s in AUTO_STRATEGIES if self.blocks_for(s, 1) is not None), None)
        if primary is None:
            return []
        order = ((keep, self.blocks_for(primary, keep)) for keep in range(self.depth - 1, 0, -1))
        return [(primary, kept) for _, kept in order if kept is not None]

    def evaluate(self, chain: str, strategy: str, kept: list[int]) -> Candidate:
        """Score one cut as it is (``chain`` "cut") or screened ("healed"; one an interrupted run journalled is
        not healed again)."""
        healed = chain == "healed"
        record = self.journal.lookup(kept) if healed else None
        model = None
        if record is not None:
            candidate = Candidate.from_dict(record)
        else:
            score = self.score(strategy, kept, healed)
            rule = self.guarantee.rule(chain)
            candidate = Candidate(strategy, kept, score.cut_accuracy, score.healed_accuracy, score.drop,
                                  rule.bound(score.drop), rule.qualifies(score.drop), score.steps, chain,
                                  score.repair(healed), score.bridge)
            if healed:
                self.journal.record(candidate.to_dict())
            model = score.model
        self.candidates.append(candidate)
        if candidate is self.winner():
            self.best_model = model
        if self.progress is not None and healed:
            self.progress.advance(0 if candidate.resumed else candidate.healing_steps,
                                  sum(c.chain == "healed" for c in self.candidates),
                                  f"{strategy} K={len(kept)} bound {100 * candidate.bound:.2f} points")
        return candidate

    def run(self) -> Candidate | None:
        """Test the fixed order as cuts, then healed (at most ``budget``; when the guarantee has that part), each
        up to its first candidate that does not qualify; the winner."""
        order = self.fixed_order()
        for chain, candidates in (("cut", order), ("healed", order[:self.budget])):
            if chain not in self.guarantee.parts:  # healing takes no step
                continue
            for strategy, kept in candidates:
                if not self.evaluate(chain, strategy, kept).qualifies:
                    break
        return self.winner()

    def winner(self) -> Candidate | None:
        """The qualifying candidate with the fewest blocks (ties: the higher validation accuracy): any choice
        among them is certified, the family-wise error being controlled over all of them."""
        qualifying = [c for c in self.candidates if c.qualifies]
        return min(qualifying, key=lambda c: (c.keep, -c.healed)) if qualifying else None

    def closest(self) -> Candidate | None:
        """The candidate nearest to qualifying (smallest bound; ties: fewer blocks), for a no-cut message."""
        return min(self.candidates, key=lambda c: (c.bound, c.keep)) if self.candidates else None
