"""``truncate --strategy auto``: the cheapest cut whose accuracy drop is certified within ``max_drop``.

Candidates are cuts (strategy, kept blocks) in one order fixed before any validation image is seen
(`CutSearch.fixed_order`): K, the number of blocks kept, from depth − 1 down to 1, each K cut by the primary
strategy (the first of `AUTO_STRATEGIES` that applies, ``bi``, whose ranking of the blocks is measured on
healing images). Dropping the least useful block first puts the cuts most likely to qualify first, which is
what gives fixed-sequence testing its power.

Each candidate's repair is chosen before it is tested, on healing images only (`CutRepair.choose`), the least
first: as it is, bridged, or healed in full (at most ``budget`` candidates healed). The repair is part of the
fixed order, so the one sequence is tested at the whole error 1 − confidence (`SearchGuarantee`); it stops at
its first candidate that does not *qualify* (the upper confidence bound of its drop above ``max_drop``; at
confidence 0 the observed drop). The winner is the last that qualified (the fewest blocks), or none; the model it
tested is the model written.

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
    cut tested as it is), the paired comparison with the uncut model after it, the optimizer steps (0: not
    healed), the repair (`RepairChoice.repair`), how it was chosen (`RepairChoice.record`), the bridge's record
    (`BridgeFit.to_dict`; None: not bridged) and the scored model."""

    cut_accuracy: float
    healed_accuracy: float
    drop: PairedDrop
    steps: int
    repair: str = "none"
    choice: dict[str, Any] = field(default_factory=dict)
    bridge: dict[str, Any] | None = None
    model: object = None


@dataclass
class Candidate:
    """One tested cut: validation accuracy before (``cut``) and after (``healed``) its repair, its paired drop,
    the drop's upper bound (a fraction) and whether it qualifies; ``repair`` (`RepairChoice.repair`), ``choice``
    (how it was chosen, on healing images) and ``bridge`` (its record, None: not bridged): what was done to it;
    ``resumed``: read back from a journal."""

    strategy: str
    kept: list[int]
    cut: float
    healed: float
    drop: PairedDrop
    bound: float
    qualifies: bool
    healing_steps: int
    repair: str = "none"
    choice: dict[str, Any] = field(default_factory=dict)
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
                "qualifies": self.qualifies, "repair": self.repair, "choice": self.choice,
                "healing_steps": self.healing_steps, "bridge": self.bridge, "resumed": self.resumed,
                **self.extra}

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> Candidate:
        """A journalled candidate (`to_dict` without ``extra``), marked ``resumed``."""
        drop = record["validation_drop"]
        return cls(record["strategy"], list(record["kept_blocks"]), record["validation_accuracy"]["cut"],
                   record["validation_accuracy"]["healed"],
                   PairedDrop(drop["images"], drop["uncut_only"], drop["cut_only"]), drop["upper_bound_points"] / 100,
                   record["qualifies"], record["healing_steps"], record["repair"], record["choice"], record["bridge"],
                   resumed=True)


class SearchProgress:
    """One bar over every healing step the search may take (a full heal for each candidate of its budget), with an
    ETA; shown only when asked and standard error is a terminal. Without the bar, ``echo`` (when given) gets one
    line per candidate tested, so a search of many minutes is never silent in a log."""

    def __init__(self, total_steps: int, candidates: int, enabled: bool,
                 echo: Callable[[str], None] | None = None):
        self.candidates = candidates
        self.bar = tqdm(total=total_steps, desc="auto search", unit="step", leave=False,
                        disable=not (enabled and sys.stderr.isatty()))
        self.echo = echo

    @property
    def shown(self) -> bool:
        return not self.bar.disable

    def advance(self, steps: int, done: int, note: str) -> None:
        """``steps`` more healing steps done; ``done`` candidates so far; ``note`` what the last one was."""
        self.bar.update(steps)
        self.bar.set_postfix_str(f"candidate {done}/{self.candidates}: {note}")
        if not self.shown and self.echo is not None:
            self.echo(f"  tested candidate {done}: {note}")

    def close(self) -> None:
        self.bar.close()


class CutSearch:
    """Walks the fixed order of ``blocks_for(strategy, keep) -> kept | None`` (None: the strategy does not apply)
    through ``score(strategy, kept, may_heal) -> Score`` (which chooses the repair on healing images; ``may_heal``
    False once ``budget`` candidates were healed), each candidate judged by ``guarantee``'s one rule, up to the
    first that does not qualify."""

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

    @property
    def healed(self) -> int:
        """Candidates healed so far, a heal the repair choice rejected included (journalled ones too)."""
        return sum(c.healing_steps > 0 or bool(c.choice.get("heal_rejected")) for c in self.candidates)

    def evaluate(self, strategy: str, kept: list[int]) -> Candidate:
        """Repair and score one cut (one an interrupted run journalled is not repaired again)."""
        record = self.journal.lookup(kept)
        model = None
        if record is not None:
            candidate = Candidate.from_dict(record)
        else:
            score = self.score(strategy, kept, self.healed < self.budget)
            rule = self.guarantee.rule
            candidate = Candidate(strategy, kept, score.cut_accuracy, score.healed_accuracy, score.drop,
                                  rule.bound(score.drop), rule.qualifies(score.drop), score.steps, score.repair,
                                  score.choice, score.bridge)
            if score.steps or score.choice.get("heal_rejected"):  # a heal was spent on it
                self.journal.record(candidate.to_dict())
            model = score.model
        self.candidates.append(candidate)
        if candidate.qualifies:
            self.best_model = model
        if self.progress is not None:
            self.progress.advance(0 if candidate.resumed else candidate.healing_steps, len(self.candidates),
                                  f"{strategy} K={len(kept)} {candidate.repair} bound {100 * candidate.bound:.2f} "
                                  "points")
        return candidate

    def run(self) -> Candidate | None:
        """Test the fixed order up to its first candidate that does not qualify; the winner."""
        for strategy, kept in self.fixed_order():
            if not self.evaluate(strategy, kept).qualifies:
                break
        return self.winner()

    @property
    def stopped_at(self) -> Candidate | None:
        """The candidate the sequence stopped at (the first that did not qualify); None: every one qualified."""
        return next((c for c in self.candidates if not c.qualifies), None)

    def winner(self) -> Candidate | None:
        """The last candidate that qualified: the fewest blocks of the qualifying prefix (any choice among them is
        certified, the family-wise error being controlled over the whole sequence)."""
        qualifying = [c for c in self.candidates if c.qualifies]
        return qualifying[-1] if qualifying else None

    def closest(self) -> Candidate | None:
        """The candidate nearest to qualifying (smallest bound; ties: fewer blocks), for a no-cut message."""
        return min(self.candidates, key=lambda c: (c.bound, c.keep)) if self.candidates else None
