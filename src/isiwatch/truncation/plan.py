"""The second stage of ``truncate``: `plan` loads the source and the images, refuses what cannot work
(`isiwatch.truncation.preflight`), measures on the uncut model what the strategy reads and, for a fixed strategy,
chooses the blocks to keep; `TruncationPlan` holds all of it for `execute`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from torch import Tensor, nn

from .._utils.option_error import OptionError
from ..io.checkpoint import Checkpoint, load_checkpoint
from ..io.models import build_model
from ..io.pretrained_dir import load_pretrained_dir
from ..io.timm_data import DataConfig, first_images, resolve_data_config
from ..measure.analysis import DEFAULT_PHASE_METRIC, analyze
from ..measure.boundary_distances import BoundaryDistances
from ..measure.depth import DepthRecommendation, recommend_depth
from ..measure.phases import Phases
from ..taps import vit_parts
from .bridge import check_bridgeable
from .classifier_layout import block_list
from .confidence import SearchGuarantee
from .data_split import NAMED, Split, load_split
from .healing import HEAL_BATCH, heal
from .preflight import check_certifiable, check_depth, check_labels, check_train_last, read_analysis
from .request import TruncateRequest
from .strategies import HEAL_LR, STRATEGIES, CutInputs, choose_blocks, get_strategy, inputs_needed
from .surgery import measure_inputs

if TYPE_CHECKING:
    from lightning_fabric import Fabric

__all__ = ["HealOptions", "TruncationPlan", "plan", "search_guarantee"]


class HealOptions(TypedDict, total=False):
    """Keyword arguments of [`heal`][isiwatch.heal] shared by every heal of a plan (the
    steps are each heal's own)."""

    lr: float
    teacher: nn.Module | None
    seed: int
    amp: bool
    train_last: int | None


@dataclass
class TruncationPlan:
    """What `execute` will do, with everything it needs loaded: the uncut model, the images, the phases,
    the depth recommendation and the boundary distances the strategy reads. ``kept`` is the fixed strategy's
    cut (None for ``auto``, which searches)."""

    request: TruncateRequest
    checkpoint: Checkpoint
    uncut: nn.Module
    split: Split
    normalization: DataConfig | None  # None: tensors or a DataLoader, used as they are
    fabric: Fabric
    metric: str
    phases: Phases | None
    recommendation: DepthRecommendation | None
    distances: BoundaryDistances | None
    kept: list[int] | None
    #: ``auto``: the uncut model's test predictions, made before the search (every test image decoded then).
    uncut_test: Tensor | None = None

    @property
    def depth(self) -> int:
        return len(block_list(self.uncut))

    @property
    def inputs(self) -> CutInputs:
        """What the strategies read about the uncut model: its phases, its boundary distances, the seed."""
        return CutInputs(self.phases, self.distances, self.request.seed)

    @property
    def speaks(self) -> bool:
        """Whether this process says the run's progress lines: it has an ``echo`` and is process 0."""
        return self.request.echo is not None and self.fabric.is_global_zero

    def say(self, line: str) -> None:
        """One progress line for a stage that takes a while, through the request's ``echo`` (process 0 only)."""
        if self.speaks:
            assert self.request.echo is not None
            self.request.echo(line)

    @property
    def heal_lr(self) -> float:
        """The peak healing learning rate: ``lr``, else `HEAL_LR` or, when lower, the rate the checkpoint records
        its weights were trained at (`Checkpoint.training_lr`): a fine-tuned backbone healed at `HEAL_LR`, which
        suits models trained from scratch at that pace, loses what its fine-tune at a rate 50 times lower kept
        (``benchmarks/bench_pretrained.py``'s ``heal only`` arms)."""
        if self.request.lr is not None:
            return self.request.lr
        return min(HEAL_LR, self.checkpoint.training_lr or HEAL_LR)

    @property
    def heal_options(self) -> HealOptions:
        """Keyword arguments of [`heal`][isiwatch.heal] for every cut of this plan."""
        r = self.request
        return {"lr": self.heal_lr, "teacher": self.uncut if r.distill else None, "seed": r.seed,
                "amp": r.device.startswith("cuda"), "train_last": r.train_last}

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps of one pass over the healing images: the loader's batches (this process's shard), or
        batches of `HEAL_BATCH` of a tensor."""
        images = self.split.train_x
        return max(1, math.ceil(len(images) / HEAL_BATCH) if isinstance(images, Tensor) else len(images))

    @property
    def heal_steps(self) -> int:
        """Optimizer steps of a full heal: ``heal_steps``, else ``epochs`` passes over the healing images."""
        r = self.request
        return r.heal_steps if r.heal_steps is not None else r.epochs * self.steps_per_epoch

    @property
    def guarantee(self) -> SearchGuarantee:
        """The error control of the ``auto`` search (`search_guarantee`)."""
        return search_guarantee(self.request)

    def heal(self, model: nn.Module, steps: int, progress: bool = False) -> int:
        """Heal ``model`` (a cut of the uncut model) for ``steps`` optimizer steps on the healing images."""
        epochs = math.ceil(steps / self.steps_per_epoch)
        options = self.heal_options
        if options["train_last"] is not None:  # auto's smaller cuts: all of their blocks
            options["train_last"] = min(options["train_last"], len(block_list(model)))
        return heal(model, self.split.train_x, self.split.train_y, epochs=epochs, max_steps=steps,
                    progress=progress, **options)


def search_guarantee(request: TruncateRequest) -> SearchGuarantee:
    """The ``auto`` search's error control: ``max_drop`` at ``confidence``, one fixed sequence."""
    return SearchGuarantee(request.max_drop, request.confidence)


def _class_map(request: TruncateRequest, ckpt: Checkpoint) -> dict[str, int] | None:
    """The class map to number class folders by: the given one, else the one the checkpoint records."""
    if isinstance(request.class_map, dict):  # TruncateRequest read a file into one
        return dict(request.class_map)
    recorded = ckpt.metadata.get("class_map")
    return {str(k): int(v) for k, v in recorded.items()} if isinstance(recorded, dict) and recorded else None


def _load(request: TruncateRequest) -> tuple[Checkpoint, nn.Module]:
    """The source's record and the uncut model: a model object, a Hugging Face directory or a checkpoint file."""
    r = request
    if isinstance(r.checkpoint, nn.Module):
        cfg = getattr(r.checkpoint, "pretrained_cfg", None) or {}
        name = type(r.checkpoint).__name__
        return Checkpoint(Path(f"<{name} object>"), cfg.get("architecture", name), {}, {}, ""), r.checkpoint
    if r.checkpoint.is_dir():  # a Hugging Face save_pretrained directory
        uncut, data_config, info = load_pretrained_dir(r.checkpoint)
        return Checkpoint(r.checkpoint, info["arch"], {}, {}, info["sha256"], data_config=data_config), uncut
    ckpt = load_checkpoint(r.checkpoint, arch=r.arch, num_heads=r.num_heads, prefer_ema=r.prefer_ema)
    return ckpt, build_model(ckpt)


def plan(request: TruncateRequest) -> TruncationPlan:
    """Load the source and the images, measure on the uncut model what the strategy reads
    (`inputs_needed`) and, for a fixed strategy, choose the blocks to keep.
    Refuses (``ValueError``) before any cut or healing."""
    r = request
    assert r.strategy is not None  # TruncateRequest resolved None to a strategy
    fabric = r.fabric_options.launch()
    ckpt, uncut = _load(r)
    uncut = uncut.to(fabric.device).eval()
    depth = len(block_list(uncut))
    check_depth(r, ckpt.path, depth)
    check_train_last(r, r.keep or depth - 1)
    tapped = vit_parts(uncut).depth  # CaiT: its class-attention blocks follow the droppable ones
    source_analysis = read_analysis(r.analysis, tapped, ckpt.sha256 or None) if r.analysis is not None else None
    norm = (resolve_data_config(uncut, str(r.data), ckpt.data_config, r.mean, r.std)
            if isinstance(r.data, NAMED) else None)
    split = load_split(uncut, r.data, r.eval_data, norm, batch_size=r.batch_size, workers=r.workers, seed=r.seed,
                       fabric=fabric, class_map=_class_map(r, ckpt))
    uncut_test = None
    if r.strategy == "auto":
        line = check_certifiable(search_guarantee(r), len(split.val_y))
        if r.bridge != "none":
            check_bridgeable(uncut, first_images(split.probe_x, 2)[0].to(fabric.device))
        uncut_test = check_labels(r, uncut, split)
        if r.echo is not None and fabric.is_global_zero:
            r.echo(line)
    metric = r.metric or (source_analysis.phase_metric if source_analysis else DEFAULT_PHASE_METRIC)
    needs = inputs_needed(r.strategy)
    probe_x, probe_y = first_images(split.probe_x, r.images)
    if source_analysis is None and (r.keep is None or "phases" in needs):  # the recommendation reads it too
        if r.echo is not None and fabric.is_global_zero:
            r.echo(f"analysing the uncut model on {len(probe_y)} healing images (phases, block scores)")
        source_analysis = analyze(uncut, probe_x, probe_y, phase_metric=metric)
    if source_analysis is not None:
        source_analysis = source_analysis.first_blocks(depth)
    inputs = measure_inputs(uncut, probe_x, needs, analysis=source_analysis, metric=metric, seed=r.seed)
    recommendation = recommend_depth(source_analysis, r.max_drop / 100) if source_analysis is not None else None
    kept = None if r.strategy == "auto" else _fixed_cut(r, ckpt.path, depth, inputs, metric, recommendation)
    return TruncationPlan(r, ckpt, uncut, split, norm, fabric, metric, inputs.phases, recommendation, inputs.distances,
                          kept, uncut_test)


def _fixed_cut(request: TruncateRequest, source: Path, depth: int, inputs: CutInputs, metric: str,
               recommendation: DepthRecommendation | None) -> list[int]:
    """The blocks a fixed strategy keeps: ``keep`` of them, else its own default depth or the recommended one;
    refused when the strategy's inputs are missing or the analysis would keep every block."""
    r = request
    assert r.strategy is not None  # TruncateRequest resolved None to a strategy
    chosen = get_strategy(r.strategy)
    if chosen.missing(inputs):  # all was measured: the curve has no plateau
        others = ["auto", *(name for name, s in STRATEGIES.items() if "phases" not in s.needs)]
        raise OptionError("no plateau in the {metric} curve of {source}; use {strategy} "
                          + ", ".join(others[:-1]) + " or " + others[-1], metric=metric, source=source)
    keep = r.keep
    if keep is None:
        assert recommendation is not None  # without keep the uncut model was analysed
        keep = chosen.default_keep(depth, inputs) if chosen.default_keep else recommendation.depth
        if keep >= depth:
            raise OptionError("the analysis recommends keeping all {depth} blocks ({signal}); pass {keep:K} to "
                              "cut anyway, or use {strategy:'auto'}", depth=depth, signal=recommendation.signal)
    check_train_last(r, keep)
    return choose_blocks(r.strategy, depth, keep, phases=inputs.phases, distances=inputs.distances, seed=r.seed)
