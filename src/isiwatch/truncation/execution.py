"""The third stage of ``truncate``: `execute` cuts and heals as the plan says (the planned blocks, or the ``auto``
search) and measures the costs of every depth it tried; `Execution` is what it made."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from ..io.timm_data import first_images
from .auto_search import AutoCut, auto_cut
from .cost import model_costs
from .healing import Images
from .plan import TruncationPlan
from .surgery import cut_vit

__all__ = ["LATENCY_ROUNDS", "Execution", "execute", "measure_costs"]

#: Timed rounds per candidate when ``auto`` measures latency.
LATENCY_ROUNDS = 10


@dataclass(frozen=True)
class Execution:
    """The healed cut: its kept source blocks, healing steps, the ``auto`` search (None for a fixed strategy), the
    images its accuracy is reported on (test for ``auto``, validation+test otherwise), whether the cut was bridged
    (then never healed: the report's "bridged cut" row is the model) and ``costs``, `measure_costs` of the uncut
    model and of every depth tried."""

    model: nn.Module
    kept: list[int]
    healing_steps: int
    search: AutoCut | None
    eval_x: Images
    eval_y: Tensor
    bridged: bool
    costs: dict[str, dict[str, Any]]


def execute(plan: TruncationPlan) -> Execution:
    """Cut and heal: the planned blocks, or the ``auto`` search (`auto_cut`); then the costs of every depth
    tried (`measure_costs`)."""
    split = plan.split
    if plan.kept is None:
        found = auto_cut(plan)
        depths = {c["keep"] for c in found.record["candidates"]} | {len(found.kept)}
        return Execution(found.model, found.kept, found.healing_steps, found, split.test_x, split.test_y,
                         found.bridged, measure_costs(plan, depths, split.test_x))
    model = cut_vit(plan.uncut, plan.kept)
    if plan.heal_steps:
        plan.say(f"healing the {len(plan.kept)}-block cut for {plan.heal_steps} step"
                 + ("s" if plan.heal_steps != 1 else ""))
    steps = plan.heal(model, plan.heal_steps, progress=plan.request.progress)
    eval_x, eval_y = split.held_out
    return Execution(model, plan.kept, steps, None, eval_x, eval_y, False,
                     measure_costs(plan, {len(plan.kept)}, eval_x))


def measure_costs(plan: TruncationPlan, depths: set[int], images: Images) -> dict[str, dict[str, Any]]:
    """The costs of the uncut model (``"uncut"``) and of a cut to each of ``depths`` blocks (keyed by the count:
    a cost depends only on it), measured once, the latencies interleaved (`model_costs`), on the first 64 of
    ``images``; every table of the run shows these figures."""
    uncut, depth = plan.uncut, plan.depth
    models = {"uncut": uncut, **{str(k): cut_vit(uncut, list(range(k))) for k in sorted(depths) if k < depth}}
    batch = _timing_batch(images).to(next(uncut.parameters()).device)
    costs = model_costs(models, batch, rounds=LATENCY_ROUNDS)
    costs[str(depth)] = costs["uncut"]
    for entry in costs.values():
        entry["latency_batch"] = len(batch)
    return costs


def _timing_batch(images: Images) -> Tensor:
    """The first 64 images (a tensor's or a loader's): the batch latencies and FLOPs are measured on."""
    return images[:64] if isinstance(images, Tensor) else first_images(images, 64)[0]
