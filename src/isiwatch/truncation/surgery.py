"""Block surgery: measure what a strategy reads, choose its blocks and copy a ViT with only those blocks — the cut
of ``truncate`` without its healing or search."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from .._utils.option_error import OptionError
from ..measure.analysis import DEFAULT_PHASE_METRIC, Analysis, analyze
from ..measure.boundary_distances import boundary_distances
from ..measure.phases import Phases
from ..taps import vit_parts
from .bridge import DEFAULT_BRIDGE, RIDGE, bridge_cut, resume_position
from .classifier_layout import block_list, block_path, with_blocks
from .confidence import AcceptanceRule, PairedDrop
from .strategies import DEFAULT_STRATEGY, CutInputs, choose_blocks, get_strategy
from .uncut_stream import UncutStream

__all__ = ["CutRepair", "RepairChoice", "cut", "cut_vit", "least_repair", "measure_inputs", "repair_name"]


def cut_vit(model: nn.Module, kept: list[int]) -> nn.Module:
    """A copy of a ViT classifier (timm or transformers) with only the ``kept`` blocks, in that order; ``model`` is
    left untouched."""
    source = block_list(model)
    depth = len(source)
    if not kept or sorted(set(kept)) != list(kept) or not 0 <= kept[0] <= kept[-1] < depth:
        raise ValueError(f"kept blocks must be ascending, distinct indices below {depth}, got {kept}")
    path = block_path(model)
    moved = [i for position, i in enumerate(kept) if i != position]
    fixed = vit_parts(model).fixed_block_positions
    if moved and fixed:
        raise OptionError("cannot move {block} {index} to position {position}: {fixed}, so such a cut does not "
                          "rebuild with timm; keep the first blocks ({strategy:'tail'})",
                          block=type(source[0]).__name__, index=moved[0], position=kept.index(moved[0]), fixed=fixed)
    cut = copy.deepcopy(model, {id(source): type(source)()})  # the blocks are not copied here…
    with_blocks(cut, path, [copy.deepcopy(source[i]) for i in kept])  # …only the kept ones, here
    return cut


@dataclass
class RepairChoice:
    """How one cut is repaired before the search tests it: ``model`` (a fresh copy of the cut as it is, bridged or
    healed), its bridge's record (`BridgeFit.to_dict`; None: not bridged), its healing ``steps`` (0: not healed)
    and ``record``, what the choice read (`CutRepair.choose`)."""

    model: nn.Module
    bridge: dict[str, Any] | None
    steps: int
    record: dict[str, Any]

    @property
    def repair(self) -> str:
        """"none", "bridge" or "heal" (a healed cut is healed from the cut as it is)."""
        return repair_name("bridged" if self.bridge is not None else "cut", self.steps > 0)


def repair_name(base: str, healed: bool) -> str:
    """A repair's name in records: "heal" (a healed cut), "bridge" (``base`` "bridged") or "none" (``base`` "cut")."""
    return "heal" if healed else "bridge" if base == "bridged" else "none"


def least_repair(tried: dict[str, PairedDrop], rule: AcceptanceRule, images: int,
                 may_heal: bool) -> tuple[str, bool]:
    """The least repair ``rule`` would pass on ``images`` validation images, from the paired comparisons of a cut
    on the calibration images (``tried``: "cut" as it is and, when fitted, "bridged"): the first of them that would
    qualify at its rates of discordant images, else healed from the cut as it is when ``may_heal``, else the one
    that comes closer; as (name, heal)."""
    unhealed = [name for name in ("cut", "bridged") if name in tried]
    for name in unhealed:
        if rule.qualifies(tried[name].scaled(images)):
            return name, False
    if may_heal or not unhealed:
        return "cut", may_heal
    return min(unhealed, key=lambda n: rule.bound(tried[n].scaled(images))), False  # ties: as cut


class CutRepair:
    """The repair of each cut of ``uncut`` an ``auto`` search tests, chosen on the calibration ``images`` and their
    ``labels`` (healing images, never validation ones), the least repair first: the cut as it is when its paired
    comparison with the uncut model there, scaled to the validation split, would qualify; else bridged (``method``)
    when that would; else healed from the cut as it is (when the caller may heal; healing bridged cuts certified fewer
    blocks in an earlier run of ``benchmarks/bench_bridge.py``), or, when it may not, whichever of the two comes
    closer. The choice reads no validation image, so it belongs to the search's fixed order. Each cut is judged and
    fitted once, on the uncut stream kept between cuts (`UncutStream`): a cut runs only from its first dropped block,
    and only when there is a choice to make."""

    def __init__(self, uncut: nn.Module, images: Tensor, labels: Tensor, method: str = DEFAULT_BRIDGE):
        self.uncut, self.images, self.labels, self.method = uncut, images, labels, method
        self.stream = UncutStream(uncut, images)
        self.models: dict[tuple[int, ...], dict[str, tuple[nn.Module, dict[str, Any] | None]]] = {}
        self.calibration: dict[tuple[int, ...], dict[str, PairedDrop]] = {}
        self.disagreement: dict[tuple[int, ...], dict[str, float]] = {}
        self.seconds = 0.0

    def choose(self, kept: list[int], rule: AcceptanceRule, images: int,
               heal: Callable[[nn.Module], int] | None = None) -> RepairChoice:
        """The repair of the cut keeping ``kept`` that ``rule`` would pass on ``images`` validation images with the
        calibration images' rates of discordant images (`least_repair`); ``heal(model) -> steps`` heals a copy of
        the cut in place (None: no healing allowed). A healed cut is kept only when its bound on the calibration
        images, which it trained on, comes closer than the unhealed one's: a heal that falls short even there
        would change predictions for nothing (recorded as ``heal_rejected``, its steps)."""
        if self.method != "none" or heal is not None:  # else nothing to choose from: no pass
            if not rule.qualifies(self.judge(kept, "cut").scaled(images)) and self.bridged(kept):
                self.judge(kept, "bridged")
        tried = self.calibration.get(tuple(kept), {})
        name, healing = least_repair(tried, rule, images, heal is not None)
        if not healing or heal is None:
            return self._chosen(kept, name, rule, images)
        model = copy.deepcopy(self.variants(kept)["cut"][0])
        steps = heal(model)
        base, _ = least_repair(tried, rule, images, False)
        if rule.bound(self.judge_healed(kept, model).scaled(images)) < rule.bound(tried[base].scaled(images)):
            return RepairChoice(model, None, steps, self._record(kept, "cut", steps, rule, images))
        return self._chosen(kept, base, rule, images, rejected=steps)

    def judge_healed(self, kept: list[int], model: nn.Module) -> PairedDrop:
        """The paired comparison with the uncut model on the calibration images of the cut keeping ``kept`` healed
        (``model``; a whole pass, healing trains blocks before the first dropped one too), measured once: a heal of
        a cut is seeded, so the same each time."""
        tried = self.calibration.setdefault(tuple(kept), {})
        if "healed" not in tried:
            start = time.perf_counter()
            predictions = self.stream.predictions(model, 0)
            tried["healed"] = PairedDrop.from_correct((self.stream.reference == self.labels).tolist(),
                                                      (predictions == self.labels).tolist())
            self.seconds += time.perf_counter() - start
        return tried["healed"]

    def judge(self, kept: list[int], name: str) -> PairedDrop:
        """The paired comparison with the uncut model on the calibration images of the cut keeping ``kept``
        (``name``: "cut" as it is, "bridged"), measured once, from its first dropped block; its share of images
        predicted another class than the uncut model's goes to ``disagreement``."""
        tried = self.calibration.setdefault(tuple(kept), {})
        if name not in tried:
            start = time.perf_counter()
            predictions = self.stream.predictions(self.variants(kept)[name][0], resume_position(kept))
            reference = self.stream.reference
            tried[name] = PairedDrop.from_correct((reference == self.labels).tolist(),
                                                  (predictions == self.labels).tolist())
            self.disagreement.setdefault(tuple(kept), {})[name] = float((predictions != reference).float().mean())
            self.seconds += time.perf_counter() - start
        return tried[name]

    def bridged(self, kept: list[int]) -> bool:
        """Fit the bridged cut keeping ``kept`` (once); whether there is one (a bridge fit asked, a run to bridge)."""
        models = self.variants(kept)
        if self.method != "none" and "bridged" not in models:
            start = time.perf_counter()
            bridged = copy.deepcopy(models["cut"][0])
            fit = bridge_cut(self.uncut, bridged, kept, self.images, self.method, self.stream)
            models["bridged"] = (bridged, fit.to_dict() if fit.bridged else None)
            self.seconds += time.perf_counter() - start
        return "bridged" in models and models["bridged"][1] is not None

    def variants(self, kept: list[int]) -> dict[str, tuple[nn.Module, dict[str, Any] | None]]:
        """The cut keeping ``kept`` as it is ("cut") and, once fitted, bridged ("bridged"), each with its bridge's
        record (None: not bridged)."""
        return self.models.setdefault(tuple(kept), {"cut": (cut_vit(self.uncut, kept), None)})

    def _chosen(self, kept: list[int], name: str, rule: AcceptanceRule, images: int, rejected: int = 0) -> RepairChoice:
        model, fit = self.variants(kept)[name]
        record = self._record(kept, name, 0, rule, images)
        if rejected:
            record["heal_rejected"] = rejected
        return RepairChoice(copy.deepcopy(model), fit, 0, record)

    def _record(self, kept: list[int], name: str, steps: int, rule: AcceptanceRule, images: int) -> dict[str, Any]:
        tried = self.calibration.get(tuple(kept), {})
        return {"calibration_images": len(self.images),
                "discordant": {n: {"uncut_only": p.uncut_only, "cut_only": p.cut_only} for n, p in tried.items()},
                "predicted_bound_points": {n: 100 * rule.bound(p.scaled(images)) for n, p in tried.items()},
                "base": "as cut" if name == "cut" else "bridged", "heal": steps > 0}

    def to_dict(self) -> dict[str, Any]:
        """The bridge's settings and what judging and fitting cost over every cut (seconds, images)."""
        return {"method": self.method, "ridge": None if self.method == "none" else RIDGE,
                "calibration_images": len(self.images),
                "cuts_judged": sum(bool(tried) for tried in self.calibration.values()),
                "cuts_fitted": sum(m.get("bridged", (None, None))[1] is not None for m in self.models.values()),
                "calibration_seconds": self.seconds}


def phases_of(analysis: Analysis, metric: str) -> Phases | None:
    """The phases of ``metric`` in ``analysis`` (None without a plateau); ``ValueError`` for an untracked curve."""
    try:
        return analysis.detect_phases(metric)
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None


def measure_inputs(model: nn.Module, images: Tensor, needs: frozenset[str], *, analysis: Analysis | None = None,
                   metric: str = DEFAULT_PHASE_METRIC, seed: int = 0) -> CutInputs:
    """What strategies reading ``needs`` (`inputs_needed`) read from the uncut
    ``model``: the phases of ``metric`` in ``analysis`` (analysing ``images`` when none is given and phases are
    needed) and the boundary distances on ``images``; nothing that is not needed is measured."""
    if analysis is None and "phases" in needs:
        analysis = analyze(model, images, phase_metric=metric).first_blocks(len(block_list(model)))
    return CutInputs(phases_of(analysis, metric) if analysis is not None else None,
                     boundary_distances(model, images) if "distances" in needs else None, seed)


def cut(model: nn.Module, keep: int, *, strategy: str = DEFAULT_STRATEGY, images: Tensor | None = None,
        metric: str = DEFAULT_PHASE_METRIC, seed: int = 0, bridge: str = "none") -> nn.Module:
    """A copy of ``model`` with only ``keep`` of its blocks, neither healed nor searched: for healing in your own
    training loop (or with [`heal`][isiwatch.heal]).

    Args:
        model: A timm ViT classifier (or a transformers one); left untouched.
        keep: How many blocks to keep, from 1 to the model's depth − 1.
        strategy: Which blocks to keep: a name in `STRATEGIES`. ``auto``
            compares healed candidates, so only [`truncate`][isiwatch.truncate] runs it.
        images: Model-ready (sized and normalised) images to measure the model on; ``plateau``, ``bi`` and
            ``angular`` read the model's response to them, a few hundred are enough.
        metric: The per-layer curve whose plateau ``plateau`` drops.
        seed: Seed of the ``random`` strategy.
        bridge: Repair the cut without training: ``"lstsq"`` (least squares) or ``"cosine"`` fit one linear map
            per run of dropped blocks on ``images`` and merge it into the kept block before the run
            (`isiwatch.truncation.bridge`; the result is still a plain model of the smaller depth), a better start
            for healing; ``"none"`` (the default): the plain cut.

    Returns:
        The cut model, a copy on ``model``'s device.

    Raises:
        ValueError: An unknown strategy or bridge, ``keep`` out of range, a strategy or a bridge that measures the
            model without ``images`` (or, for ``plateau``, a curve without a plateau), or a family the bridge
            cannot merge into (parallel or post-norm blocks).
    """
    chosen = get_strategy(strategy)
    needs = chosen.needs
    if needs and images is None:
        raise OptionError("the {name} strategy measures the model: pass {images}", name=chosen.name)
    if bridge != "none" and images is None:
        raise OptionError("{bridge} fits the bridge on images: pass {images}")
    depth = len(block_list(model))
    inputs = CutInputs(seed=seed) if images is None else measure_inputs(model, images, needs, metric=metric, seed=seed)
    kept = choose_blocks(chosen.name, depth, keep, phases=inputs.phases, distances=inputs.distances, seed=seed)
    result = cut_vit(model, kept)
    if bridge != "none":
        assert images is not None  # checked above
        bridge_cut(model, result, kept, images, bridge)
    return result

