"""The fourth stage of ``truncate``: `report`, the record of a run (``truncate_report.json``): the costs and
held-out accuracies of every model it made and every choice made on the way, the ``auto`` search with each
candidate's costs and the winner's test score, or what would certify the nearest candidate."""

from __future__ import annotations

import math
import shlex
from typing import Any

from torch import Tensor

from ..io.timm_data import validate_py_command
from .confidence import AcceptanceRule, PairedDrop, SearchGuarantee
from .data_split import NAMED
from .execution import Execution
from .healing import default_train_last, predict
from .plan import TruncationPlan
from .surgery import cut_vit, least_repair, repair_name
from .truncate_report import measure

__all__ = ["certified", "cut_model_kwargs", "report", "stage_predictions", "to_certify"]


def report(plan: TruncationPlan, execution: Execution) -> dict[str, Any]:
    """The report dict: costs and held-out accuracies of every model the run made (`stage_predictions`,
    `measure`) and every choice made on the way."""
    r, kept, depth = plan.request, execution.kept, plan.depth
    stages = stage_predictions(plan, execution)
    result = measure(plan.checkpoint, execution.costs["uncut"], execution.costs[str(len(kept))],
                     "test" if execution.search else "validation+test", execution.eval_y, stages)
    search = None if execution.search is None else _search(plan, execution, stages)
    strategy = r.strategy if search is None else \
        f"auto: {search['winner_strategy']}" if search["winner"] else "auto: nothing cut"
    result.update({"strategy": strategy,
                   "metric": plan.metric, "phases": plan.phases.to_dict() if plan.phases else None,
                   "recommendation": plan.recommendation.to_dict() if plan.recommendation else None,
                   "kept_blocks": kept, "dropped_blocks": sorted(set(range(depth)) - set(kept)),
                   "train_last": default_train_last(len(kept)) if r.train_last is None else min(r.train_last,
                                                                                                  len(kept)),
                   "epochs": r.epochs, "heal_steps": plan.heal_steps, "healing_steps": execution.healing_steps,
                   "lr": plan.heal_lr, "distill": r.distill, "data": plan.split.data,
                   "weights": plan.checkpoint.weights,
                   "normalization": plan.normalization.to_dict() if plan.normalization else None,
                   "device": str(plan.fabric.device), "processes": plan.fabric.world_size,
                   "batch": plan.split.batch, "labels": plan.split.labels,
                   "precision": str(plan.fabric.strategy.precision.precision),
                   "seed": r.seed, "output": None if r.out is None else str(r.out),
                   "evaluated_on": "test" if search else "validation+test", "search": search})
    data = r.data if r.eval_data is None else r.eval_data  # validate.py finds validation/ as this split did
    if r.out is not None and isinstance(data, NAMED) and str(data) != "mnist" and plan.normalization is not None \
            and not plan.checkpoint.path.is_dir() and (search is None or search["winner"] is not None):
        result["validate_command"] = shlex.join(validate_py_command(
            data, plan.checkpoint.arch, r.out, cut_model_kwargs(plan, execution), plan.normalization,
            plan.fabric.device.type))
    return result


def _search(plan: TruncationPlan, execution: Execution, stages: dict[str, Tensor]) -> dict[str, Any]:
    """The report's ``search``: the search's record with each candidate's costs, what would certify the nearest
    candidate when none was, and the winner (or the uncut model) scored once on the test split."""
    assert execution.search is not None  # an auto run
    record = execution.search.record
    costs = execution.costs
    search = {**record, "candidates": [{**c, **{k: v for k, v in costs[str(c["keep"])].items() if k != "blocks"}}
                                       for c in record["candidates"]]}
    if search["winner"] is None:
        search["to_certify"] = to_certify(search, plan.guarantee)
    labels = execution.eval_y
    drop = PairedDrop.from_correct((stages["uncut"] == labels).tolist(), (list(stages.values())[-1] == labels).tolist())
    search["test"] = {"points": 100 * drop.drop, **drop.to_dict(),
                      "within_max_drop": 100 * drop.drop <= plan.request.max_drop + 1e-9}
    return search


def stage_predictions(plan: TruncationPlan, execution: Execution) -> dict[str, Tensor]:
    """Predictions on the reported images of each model the run made, in the order it made them: ``uncut``,
    then for a cut ``cut`` (as it is) and, when repaired, ``bridged`` or ``healed`` (a cut is never both). The last
    is the written model, always scored as itself."""
    x, search = execution.eval_x, execution.search
    reference = plan.uncut_test if search is not None and plan.uncut_test is not None else predict(plan.uncut, x)
    if len(execution.kept) == plan.depth:
        return {"uncut": reference}
    bridged, healed = execution.bridged, execution.healing_steps > 0
    stages = {"uncut": reference}
    if bridged or healed:  # the cut as it is was made, then repaired
        stages["cut"] = predict(cut_vit(plan.uncut, execution.kept), x)
    stages["healed" if healed else "bridged" if bridged else "cut"] = predict(execution.model, x)
    return stages


def to_certify(search: dict[str, Any], guarantee: SearchGuarantee) -> dict[str, Any] | None:
    """What would certify the candidate nearest to qualifying (smallest upper bound) of a search that certified
    none: ``max_drop``, the smallest ``--max-drop`` (points, rounded up to 0.01) its bound is within, and
    ``validation_images``, how many validation images its observed rates of discordant images would need at
    the run's ``max_drop``; each None where no number does (its observed drop is not below the max drop) or
    where the search would then choose another repair for it (`least_repair`: a larger max drop or more images
    may pass it as it is, a model never measured on validation). None without candidates."""
    if not search["candidates"]:
        return None
    best = min(search["candidates"], key=lambda c: (c["validation_drop"]["upper_bound_points"], c["keep"]))
    drop, choice = best["validation_drop"], best.get("choice") or {}
    pair = PairedDrop(drop["images"], drop["uncut_only"], drop["cut_only"])
    tried = {name: PairedDrop(choice["calibration_images"], c["uncut_only"], c["cut_only"])
             for name, c in (choice.get("discordant") or {}).items()}

    def same_repair(rule: AcceptanceRule, images: int) -> bool:
        name, heal = least_repair(tried, rule, images, search["heal_steps"] > 0)
        return repair_name(name, heal) == str(best["repair"])
    max_drop = math.ceil(round(100 * drop["upper_bound_points"], 6)) / 100
    images = guarantee.rule.images_to_qualify(pair)
    return {"strategy": best["strategy"], "keep": best["keep"], "repair": best["repair"],
            "upper_bound_points": drop["upper_bound_points"],
            "max_drop": max_drop if same_repair(AcceptanceRule(max_drop, guarantee.alpha), pair.images) else None,
            "validation_images": images if images is not None and same_repair(guarantee.rule, images) else None}


def cut_model_kwargs(plan: TruncationPlan, execution: Execution) -> dict[str, Any]:
    """``timm.create_model`` keyword arguments of the written cut: the source's at the cut depth, with the data
    config as ``pretrained_cfg_overlay`` so ``timm.data.resolve_data_config(model=...)`` gives its preprocessing."""
    kwargs = {**plan.checkpoint.model_kwargs, "depth": len(execution.kept)}
    if plan.normalization is not None:
        kwargs["pretrained_cfg_overlay"] = plan.normalization.pretrained_cfg()
    return kwargs


def certified(report: dict[str, Any]) -> bool:
    """Whether a report's run cut the model: a fixed strategy always does; ``auto`` only when it certified a
    cut (else it writes nothing)."""
    search = report.get("search")
    return not isinstance(search, dict) or search.get("winner") is not None
