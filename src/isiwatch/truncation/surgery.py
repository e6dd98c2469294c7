"""Block surgery: measure what a strategy reads, choose its blocks and copy a ViT with only those blocks — the cut
of ``truncate`` without its healing or search."""

from __future__ import annotations

import copy
import time
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

__all__ = ["CutRepair", "cut", "cut_vit", "measure_inputs"]


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


class CutRepair:
    """The cuts of ``uncut`` an ``auto`` search tests, each bridged (``method``) when the bridged cut agrees with
    the uncut model's predictions on more of the calibration ``images`` (healing images) than the cut as it is:
    a choice that reads no validation image, so it belongs to the search's fixed order. Each cut is fitted once,
    on the uncut stream kept between cuts (`UncutStream`); ``to_dict`` sums the calibration cost."""

    def __init__(self, uncut: nn.Module, images: Tensor | None, method: str = DEFAULT_BRIDGE):
        if method != "none" and images is None:
            raise ValueError("a bridge needs calibration images")
        self.uncut, self.images, self.method = uncut, images, method
        self.stream = None if images is None or method == "none" else UncutStream(uncut, images)
        self.chosen: dict[tuple[int, ...], tuple[nn.Module, dict[str, Any] | None]] = {}
        self.seconds = 0.0

    def __call__(self, kept: list[int]) -> tuple[nn.Module, dict[str, Any] | None]:
        """A fresh copy of the cut keeping ``kept``, bridged or not, and its bridge's record (None: not bridged)."""
        key = tuple(kept)
        if key not in self.chosen:
            self.chosen[key] = self._choose(kept)
        model, fit = self.chosen[key]
        return copy.deepcopy(model), fit

    def _choose(self, kept: list[int]) -> tuple[nn.Module, dict[str, Any] | None]:
        cut = cut_vit(self.uncut, kept)
        if self.stream is None:
            return cut, None
        start = time.perf_counter()
        reference = self.stream.reference  # first: its pass also stores the whole stream
        bridged = copy.deepcopy(cut)
        fit = bridge_cut(self.uncut, bridged, kept, self.stream.images, self.method, self.stream)
        resume = resume_position(kept)
        agree = {name: float((self.stream.predictions(m, resume) == reference).float().mean())
                 for name, m in (("cut", cut), ("bridged", bridged))}
        self.seconds += time.perf_counter() - start
        record = {**fit.to_dict(), "calibration_agreement": agree}
        return (bridged, record) if agree["bridged"] > agree["cut"] and fit.bridged else (cut, None)

    def to_dict(self) -> dict[str, Any]:
        """The bridge's settings and what fitting and choosing cost over every cut (seconds, images)."""
        return {"method": self.method, "ridge": None if self.method == "none" else RIDGE,
                "calibration_images": 0 if self.images is None else len(self.images), "cuts_fitted": len(self.chosen)
                if self.stream is not None else 0, "calibration_seconds": self.seconds}


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

