"""The ``auto`` stage of ``truncate``: `auto_cut` runs the certified search (`isiwatch.truncation.search`) over a
plan's uncut model with the shipped scorer (`CandidateScorer`) and returns `AutoCut`, the model it chose and the
search's record."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from .._utils.wording import counted, points
from ..io.timm_data import first_images
from .confidence import SearchGuarantee
from .healing import predict
from .journal import SearchJournal
from .plan import TruncationPlan
from .scoring import CandidateScorer
from .search import Candidate, CutSearch, SearchProgress
from .surgery import CutRepair
from .truncate_report import REPAIRS

__all__ = ["AutoCut", "auto_cut"]


@dataclass(frozen=True)
class AutoCut:
    """What the ``auto`` search chose: the model it tested (a copy of the uncut one when no cut was certified),
    its kept source blocks and ``record``, the search as the report's ``search`` holds it before the costs and the
    test score are added (the rule, every candidate, the winner or the ``message`` saying why there is none)."""

    model: nn.Module
    kept: list[int]
    record: dict[str, Any]

    @property
    def winner(self) -> dict[str, Any] | None:
        """The certified candidate's record; None: nothing was cut."""
        winner: dict[str, Any] | None = self.record["winner"]
        return winner

    @property
    def healing_steps(self) -> int:
        """The winner's healing steps (0: not healed, or nothing cut)."""
        return int(self.record["healing_steps"])

    @property
    def bridged(self) -> bool:
        """Whether the winner was bridged (then never healed)."""
        return self.winner is not None and self.winner["bridge"] is not None


def _search_header(plan: TruncationPlan, guarantee: SearchGuarantee, uncut_correct: Tensor) -> dict[str, Any]:
    """What a journal records its search was: a resumed search must be this one to reuse its candidates."""
    r = plan.request
    return {"source_sha256": plan.checkpoint.sha256, "depth": plan.depth,
            "data": plan.split.data, "uncut_validation_correct": int(uncut_correct.sum()),
            "rule": guarantee.to_dict(), "budget": r.budget, "heal_steps": plan.heal_steps, "bridge": r.bridge,
            "images": r.images, "lr": plan.heal_lr, "distill": r.distill,
            "train_last": r.train_last, "seed": r.seed, "metric": plan.metric}


def auto_cut(plan: TruncationPlan) -> AutoCut:
    """The cheapest certified cut of the plan's uncut model (or a copy of it), its kept blocks, the search
    record (`isiwatch.truncation.search`).

    Each cut of the fixed order is repaired as `CutRepair` chooses on the healing images (as it is, bridged, or
    healed in full from the cut as it is, `TruncationPlan.heal_steps`) and tested, in that one sequence, by
    `TruncationPlan.guarantee` (`CandidateScorer`); the winner's model is the one it tested. The search journal
    (``journal``) makes an interrupted search resumable (``resume``); a search that certified no cut leaves none
    (there is nothing to resume).
    """
    r, split, uncut = plan.request, plan.split, plan.uncut
    assert plan.distances is not None  # plan() measures them for auto
    depth, full, guarantee = plan.depth, plan.heal_steps, plan.guarantee
    plan.say(f"scoring the uncut model on the {len(split.val_y)} validation images, then the cuts from "
             f"{depth - 1} blocks down, each repaired as the healing images choose (at most {r.budget} healed)")
    uncut_correct = predict(uncut, split.val_x) == split.val_y
    repair = CutRepair(uncut, *first_images(split.probe_x, r.images), r.bridge)
    scorer = CandidateScorer(depth, plan.inputs, repair, guarantee.rule, uncut_correct, full, plan.heal,
                             (split.val_x, split.val_y))
    journal = SearchJournal(r.journal, _search_header(plan, guarantee, uncut_correct), resume=r.resume)
    if journal.finished:
        finished = counted(len(journal.finished), "finished candidate")
        plan.say(f"resuming the search journalled in {r.journal}: {finished} taken from it, not healed again")
    progress = SearchProgress(r.budget * full, r.budget, r.progress, plan.say if plan.speaks else None)
    search = CutSearch(depth, guarantee, r.budget, scorer.blocks_for, scorer.score, journal=journal,
                       progress=progress)
    try:
        winner = search.run()
        model = _winner_model(search, winner, scorer)
    except ValueError:  # a refusal (an interrupted or crashed search keeps its journal to resume from)
        journal.discard()
        raise
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM under the command line: nothing finished, nothing to resume
        if not journal.finished:
            journal.discard()
        raise
    finally:
        progress.close()
    for c in search.candidates:
        c.extra = {"winner": c is winner}
    stopped = search.stopped_at
    record: dict[str, Any] = {
        "max_drop": r.max_drop, "confidence": r.confidence, "rule": guarantee.to_dict(), "budget": r.budget,
        "heal_steps": full, "validation_images": len(split.val_y),
        "test_images": len(split.test_y), "uncut_validation_accuracy": float(uncut_correct.float().mean()),
        "journal": None if r.journal is None else str(r.journal),
        "resumed_candidates": sum(c.resumed for c in search.candidates),
        "candidates": [c.to_dict() for c in search.candidates], "winner": winner.to_dict() if winner else None,
        "winner_strategy": winner.strategy if winner else "uncut",
        "stopped_at": None if stopped is None else stopped.keep,
        "healing_steps": winner.healing_steps if winner else 0, "order": len(search.fixed_order()),
        "bridge": repair.to_dict(), "message": None if winner else _no_cut_message(plan, search)}
    if winner is None:
        if r.journal is not None and plan.fabric.is_global_zero:
            r.journal.unlink(missing_ok=True)
        return AutoCut(copy.deepcopy(uncut), list(range(depth)), record)
    assert model is not None  # _winner_model gives the winner's
    return AutoCut(model, winner.kept, record)


def _no_cut_message(plan: TruncationPlan, search: CutSearch) -> str:
    """Why nothing was cut, and how close the nearest candidate came."""
    closest = search.closest()
    return (f"no cut: no cut of the {plan.depth}-block model was certified within {points(plan.request.max_drop)} "
            f"after {len(search.candidates)} candidates"
            + ("" if closest is None else
               f"; the closest, {closest.strategy} keeping {closest.keep} blocks {REPAIRS[closest.repair]}, dropped "
               f"{points(100 * closest.drop.drop, '.2f')} on validation with an upper bound of "
               f"{points(100 * closest.bound, '.2f')}"))


def _winner_model(search: CutSearch, winner: Candidate | None, scorer: CandidateScorer) -> nn.Module | None:
    """The model the winner was tested as; one read back from a journal is repaired again (the same choice on
    the same healing images, the same seeded heal)."""
    if winner is None:
        return None
    if isinstance(search.best_model, nn.Module):
        return search.best_model
    model = scorer.score(winner.strategy, winner.kept, winner.healing_steps > 0).model
    assert isinstance(model, nn.Module)
    return model
