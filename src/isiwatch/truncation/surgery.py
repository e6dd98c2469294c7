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
from .strategies import DEFAULT_STRATEGY, CutInputs, choose_blocks, get_strategy
from .uncut_stream import UncutStream

__all__ = ["CutRepair", "RepairChoice", "cut", "cut_vit", "measure_inputs"]


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
    """How one cut is repaired before the search tests it: ``model`` (a fresh copy of the cut as it is or
    bridged), its bridge's record (`BridgeFit.to_dict`; None: not bridged), whether to ``heal`` it and ``record``,
    what the choice read (`CutRepair.choose`)."""

    model: nn.Module
    bridge: dict[str, Any] | None
    heal: bool
    record: dict[str, Any]

    @property
    def repair(self) -> str:
        """"none", "bridge", "heal" or "bridge+heal"."""
        return "+".join(n for n, done in (("bridge", self.bridge is not None), ("heal", self.heal)) if done) or "none"


class CutRepair:
    """The repair of each cut of ``uncut`` an ``auto`` search tests, chosen on the calibration ``images`` (healing
    images, never validation ones), the least repair first: the cut as it is when its disagreement with the uncut
    model's predictions there would qualify (``enough``), else bridged (``method``) when that would, else healed
    (when the caller may heal) from whichever of the two disagrees less. The choice reads no validation image, so
    it belongs to the search's fixed order. Each cut is judged and fitted once, on the uncut stream kept between
    cuts (`UncutStream`): a cut runs only from its first dropped block, and only when there is a choice to make."""

    def __init__(self, uncut: nn.Module, images: Tensor, method: str = DEFAULT_BRIDGE):
        self.uncut, self.images, self.method = uncut, images, method
        self.stream = UncutStream(uncut, images)
        self.models: dict[tuple[int, ...], dict[str, tuple[nn.Module, dict[str, Any] | None]]] = {}
        self.disagreement: dict[tuple[int, ...], dict[str, float]] = {}
        self.seconds = 0.0

    def choose(self, kept: list[int], enough: Callable[[float], bool], may_heal: bool) -> RepairChoice:
        """The repair of the cut keeping ``kept``: ``enough(disagreement)`` says whether a cut disagreeing with the
        uncut model on that share of the calibration images would qualify; ``may_heal``: healing is allowed."""
        if self.method == "none" and not may_heal:  # nothing to choose from: no pass
            return self._chosen(kept, "cut", False)
        for name in ("cut", "bridged"):
            if name == "bridged" and not self.bridged(kept):
                break
            if enough(self.judge(kept, name)):
                return self._chosen(kept, name, False)
        tried = self.disagreement[tuple(kept)]
        return self._chosen(kept, min(tried, key=lambda n: tried[n]), may_heal)  # ties: as cut

    def judge(self, kept: list[int], name: str) -> float:
        """The share of the calibration images on which the cut keeping ``kept`` (``name``: "cut" as it is,
        "bridged") predicts another class than the uncut model (measured once, from its first dropped block)."""
        tried = self.disagreement.setdefault(tuple(kept), {})
        if name not in tried:
            start = time.perf_counter()
            predictions = self.stream.predictions(self.variants(kept)[name][0], resume_position(kept))
            tried[name] = float((predictions != self.stream.reference).float().mean())
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

    def _chosen(self, kept: list[int], name: str, heal: bool) -> RepairChoice:
        model, fit = self.variants(kept)[name]
        record = {"calibration_images": len(self.images), "disagreement": dict(self.disagreement.get(tuple(kept), {})),
                  "base": "as cut" if name == "cut" else "bridged", "heal": heal}
        return RepairChoice(copy.deepcopy(model), fit, heal, record)

    def to_dict(self) -> dict[str, Any]:
        """The bridge's settings and what judging and fitting cost over every cut (seconds, images)."""
        return {"method": self.method, "ridge": None if self.method == "none" else RIDGE,
                "calibration_images": len(self.images),
                "cuts_judged": sum(bool(tried) for tried in self.disagreement.values()),
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

