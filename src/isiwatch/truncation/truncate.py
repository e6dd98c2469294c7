"""``truncate``: cut a trained timm ViT down to fewer blocks and heal it by fine-tuning its late blocks.

Strategies choose which blocks to keep:

- ``plateau``: drop the blocks that sit on the plateau of a per-layer curve
  (:mod:`isiwatch.measure.phases`). The curve is measured
  on block *outputs*, so a plateau ``(s, e)`` says block ``s`` already reached the plateau level and blocks
  ``s+1..e`` kept it there: those are dropped (the default keep is ``L − (e − s)``). Any other ``keep``
  drops the blocks nearest the middle of that run first (later blocks first on ties).
- ``tail``: keep the first K blocks.
- ``bi``: ShortGPT block influence, drop the blocks that change their input least.
- ``angular``: Gromov angular distance, drop the L−K consecutive blocks whose input and output are closest.
- ``random``: drop L−K blocks chosen by a seeded permutation.

Healing freezes the embeddings and the early kept blocks (in eval mode) and trains the late
``train_last`` kept blocks, the final norm and the head with AdamW and a cosine schedule, optionally
distilling the uncut model's logits. The output loads with ``timm.create_model(arch, **model_kwargs)``
and ``load_state_dict(strict=True)`` and records which source blocks it kept.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import timm
import torch
from torch import Tensor, nn

from .._utils.files import write_json
from ..io.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from ..io.data import DIGITS_TRAIN, DataError, Normalization, embedded_digits, fit_to_model, renormalize
from ..io.model_images import model_input, probe_images, resolve_normalization
from ..io.models import build_model
from ..io.pretrained_dir import load_pretrained_dir, save_pretrained_dir
from ..measure.analysis import DEFAULT_PHASE_METRIC, Analysis, analyze
from ..measure.boundary_distances import BoundaryDistances, angular_distance, block_influence, boundary_distances
from ..measure.depth import DepthRecommendation, recommend_depth
from ..measure.phases import Phases
from ..taps import TapError, vit_parts
from .classifier_layout import block_list, block_path, modules_after_blocks, num_classes, with_blocks
from .cost import count_parameters, forward_flops, measure_latency
from .healing import accuracy, predict, train_classifier
from .strategies import (
    DEFAULT_BUDGET,
    DEFAULT_MAX_DROP,
    DEFAULT_STRATEGY,
    HEAL_EPOCHS,
    HEAL_LR,
    STRATEGIES,
    CutSearch,
    check_search_options,
)
from .truncate_report import candidates_table, measure, report_table

__all__ = ["STRATEGIES", "Execution", "Split", "TruncateRequest", "TruncateResult", "TruncationPlan",
           "auto_cut", "candidates_table", "choose_blocks", "cut_vit", "execute", "heal", "load_split", "plan",
           "report", "report_table", "truncate", "write"]

#: Share of an ImageFolder held out (halved into validation and test).
HELD_OUT_FRACTION = 0.2
#: Timed rounds per candidate when ``auto`` measures latency.
LATENCY_ROUNDS = 10


def _blocks(model: nn.Module) -> nn.Sequential | nn.ModuleList:
    """The blocks truncation may drop (:func:`~isiwatch.truncation.classifier_layout.block_list`)."""
    try:
        return block_list(model)
    except TapError as exc:
        raise ValueError(f"cannot truncate {type(model).__name__}: {exc}") from None


def plateau_drop_order(phases: Phases, depth: int) -> list[int]:
    """All block indices, the first to drop first: the plateau's blocks after its first, nearest the middle
    of that run first, then outwards (later blocks first on equal distance)."""
    start, end = phases.plateau[0] + 1, phases.plateau[1]
    middle = (start + end) / 2
    return sorted(range(depth), key=lambda i: (abs(i - middle), -i))


def plateau_keep(phases: Phases, depth: int) -> int:
    """The depth the plateau cut leaves by default: all but the plateau's blocks after its first."""
    return depth - (phases.plateau[1] - phases.plateau[0])


def choose_blocks(strategy: str, depth: int, keep: int, *, phases: Phases | None = None,
                  distances: BoundaryDistances | None = None, seed: int = 0) -> list[int]:
    """The ``keep`` source block indices (ascending) that ``strategy`` keeps out of ``depth``.

    ``plateau`` needs ``phases``; ``bi`` and ``angular`` need ``distances`` of the uncut model.
    """
    if not 1 <= keep < depth:
        raise ValueError(f"keep must be between 1 and {depth - 1} for a {depth}-block model, got {keep}")
    drop = depth - keep
    dropped: Sequence[int]
    if strategy == "tail":
        dropped = range(keep, depth)
    elif strategy == "plateau":
        if phases is None:
            raise ValueError("the plateau strategy needs phases with a plateau")
        dropped = plateau_drop_order(phases, depth)[:drop]
    elif strategy == "bi":
        dropped = block_influence(_need(distances)).argsort(stable=True)[:drop].tolist()
    elif strategy == "angular":
        start = int(angular_distance(_need(distances), drop).argmin())
        dropped = range(start, start + drop)
    elif strategy == "random":
        dropped = torch.randperm(depth, generator=torch.Generator().manual_seed(seed))[:drop].tolist()
    else:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    return sorted(set(range(depth)) - set(dropped))


def _need(distances: BoundaryDistances | None) -> BoundaryDistances:
    if distances is None:
        raise ValueError("the bi and angular strategies need boundary distances of the uncut model")
    return distances


def cut_vit(model: nn.Module, kept: list[int]) -> nn.Module:
    """A copy of a ViT classifier (timm or transformers) with only the ``kept`` blocks, in that order; ``model`` is
    left untouched."""
    source = _blocks(model)
    depth = len(source)
    if not kept or sorted(set(kept)) != list(kept) or not 0 <= kept[0] <= kept[-1] < depth:
        raise ValueError(f"kept blocks must be ascending, distinct indices below {depth}, got {kept}")
    path = block_path(model)
    moved = [i for position, i in enumerate(kept) if i != position]
    fixed = vit_parts(model).fixed_block_positions
    if moved and fixed:
        raise ValueError(f"cannot move {type(source[0]).__name__} {moved[0]} to position {kept.index(moved[0])}: "
                         f"{fixed}, so such a cut does not rebuild with timm; keep the first blocks (--strategy tail)")
    cut = copy.deepcopy(model, {id(source): type(source)()})  # the blocks are not copied here…
    with_blocks(cut, path, [copy.deepcopy(source[i]) for i in kept])  # …only the kept ones, here
    return cut


def trainable_modules(model: nn.Module, train_last: int) -> list[nn.Module]:
    """What healing trains: the last ``train_last`` blocks and the modules after the blocks."""
    blocks = _blocks(model)
    if not 0 <= train_last <= len(blocks):
        raise ValueError(f"train_last must be between 0 and {len(blocks)}, got {train_last}")
    return list(blocks[len(blocks) - train_last:]) + modules_after_blocks(model)


def prepare_healing(model: nn.Module, train_last: int) -> list[nn.Parameter]:
    """Freeze ``model`` into eval mode except what healing trains (see :func:`trainable_modules`), which is
    put in train mode; returns the parameters to optimise."""
    trainable = trainable_modules(model, train_last)
    model.requires_grad_(False).eval()
    for module in trainable:
        module.requires_grad_(True).train()
    return [p for module in trainable for p in module.parameters()]


def default_train_last(keep: int) -> int:
    """The late half of the kept blocks (rounded up): the same healing budget for every strategy."""
    return math.ceil(keep / 2)


def heal(model: nn.Module, images: Tensor, labels: Tensor, *, train_last: int | None = None, epochs: int = HEAL_EPOCHS,
         lr: float = HEAL_LR, teacher: nn.Module | None = None, seed: int = 0, progress: bool = False,
         amp: bool = False) -> int:
    """Fine-tune the late ``train_last`` blocks (default: :func:`default_train_last`), final norm and head of a
    cut ViT in place; returns optimizer steps.

    Everything else is frozen and kept in eval mode (no dropout, drop-path or norm updates there). With
    ``teacher`` the loss adds KL distillation to its logits. ``amp``: bfloat16 autocast on CUDA. The model
    is left in eval mode with every parameter trainable again.
    """
    params = prepare_healing(model, default_train_last(len(_blocks(model))) if train_last is None else train_last)
    if teacher is not None:
        teacher.eval()
    try:
        return train_classifier(model, images, labels, epochs=epochs, lr=lr, params=params, teacher=teacher,
                                seed=seed, progress=progress, desc="heal", schedule="cosine", amp=amp)
    finally:
        model.requires_grad_(True).eval()


@dataclass
class Split:
    """Healing images, validation images (``auto`` chooses its cut on them) and test images (the reported
    accuracy of an ``auto`` cut); a fixed-strategy cut reports on validation and test together."""

    train_x: Tensor
    train_y: Tensor
    val_x: Tensor
    val_y: Tensor
    test_x: Tensor
    test_y: Tensor
    #: Which images each part holds: ``{"heal" | "validation" | "test": {"source", "images", "of"}}`` (``of``:
    #: the images in that source), so a report says whether "held out" really is.
    data: dict[str, dict[str, str | int]] = field(default_factory=dict)

    @property
    def held_out(self) -> tuple[Tensor, Tensor]:
        return torch.cat([self.val_x, self.test_x]), torch.cat([self.val_y, self.test_y])


def train_val_dirs(data: str) -> tuple[Path, Path] | None:
    """``DIR/train`` and ``DIR/validation`` (or ``DIR/val``) when ``data`` has timm ``train.py``'s layout."""
    root = Path(data)
    val = next((root / name for name in ("validation", "val") if (root / name).is_dir()), None)
    return (root / "train", val) if val is not None and (root / "train").is_dir() else None


def _images(model: nn.Module, data: str, norm: Normalization | None) -> tuple[Tensor, Tensor]:
    if data == "mnist":
        images, labels = embedded_digits()
        images = fit_to_model(images, *model_input(model))
        return renormalize(images, norm) if norm is not None else images, labels
    return probe_images(model, data, None, norm)


def load_split(model: nn.Module, data: str, eval_data: str | None = None,
               norm: Normalization | None = None) -> Split:
    """Healing, validation and test images, normalised with ``norm``.

    With ``eval_data``, or when ``data`` has ``train/`` and ``validation/`` (or ``val/``) sub-folders (timm
    ``train.py``'s layout), all of ``data`` (its ``train/``) heals and the evaluation folder is halved into
    validation and test: a folder split would measure "held-out" accuracy on training images. Otherwise one
    source is split: 'mnist' as the demo does (4,000 healing / 1,000 held-out digits), an ImageFolder by holding
    out a fixed HELD_OUT_FRACTION; the held-out images are halved into validation and test.
    """
    layout = train_val_dirs(data) if eval_data is None and data != "mnist" else None
    heal_source, eval_source = (str(layout[0]), str(layout[1])) if layout else (data, eval_data)
    images, labels = _images(model, heal_source, norm)
    if eval_source is None:
        if data == "mnist":
            cut = DIGITS_TRAIN
        else:
            if len(images) < 3:
                raise DataError(f"{data}: need at least 3 images to heal, validate and test, found {len(images)}")
            cut = len(images) - max(2, round(HELD_OUT_FRACTION * len(images)))
        heal_x, heal_y, eval_x, eval_y = images[:cut], labels[:cut], images[cut:], labels[cut:]
    else:
        heal_x, heal_y = images, labels
        eval_x, eval_y = _images(model, eval_source, norm)
        if len(eval_x) < 2:
            raise DataError(f"{eval_source}: need at least 2 images to validate and test, found {len(eval_x)}")
    classes = num_classes(model)
    if classes == 0:
        raise DataError(f"{type(model).__name__} has no classification head to heal and score a cut with "
                        "(use a classifier, e.g. ViTForImageClassification)")
    for source, y in ((heal_source, heal_y), (eval_source or data, eval_y)):
        if int(y.max()) >= classes:
            raise DataError(f"{source}: {int(y.max()) + 1} classes but the model's head has {classes} outputs")
    half = len(eval_x) // 2
    total = len(eval_x) if eval_source else len(images)
    record: dict[str, dict[str, str | int]] = {
        "heal": {"source": heal_source, "images": len(heal_x), "of": len(images)},
        "validation": {"source": eval_source or data, "images": half, "of": total},
        "test": {"source": eval_source or data, "images": len(eval_x) - half, "of": total}}
    return Split(heal_x, heal_y, eval_x[:half], eval_y[:half], eval_x[half:], eval_y[half:], record)


def _read_analysis(path: Path, depth: int, sha256: str) -> Analysis:
    try:
        result = Analysis.from_dict(json.loads(Path(path).read_text()))
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"{path}: not a readable analysis.json ({type(exc).__name__}: {exc})") from None
    if result.model_info.get("sha256") not in (None, sha256):
        raise ValueError(f"{path}: analysis was computed on a different checkpoint (sha256 differs)")
    blocks = len(next(iter(result.layers.values()), []))
    if blocks != depth:
        raise ValueError(f"{path}: analysis has {blocks} blocks but the checkpoint has {depth}")
    return result


def _phases(analysis: Analysis, metric: str) -> Phases | None:
    try:
        return analysis.detect_phases(metric)
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None


def _check_paths(inputs: dict[str, Path | None], outputs: dict[str, Path | None]) -> None:
    """Every output path differs from every input and from the other outputs (nothing is overwritten)."""
    seen = {Path(p).resolve(): name for name, p in inputs.items() if p is not None}
    for name, path in outputs.items():
        if path is None:
            continue
        clash = seen.get(Path(path).resolve())
        if clash is not None:
            kind = "input" if clash in inputs else "output"
            raise ValueError(f"{path}: {name} names the same file as the {kind} {clash}; choose another path")
        seen[Path(path).resolve()] = name


@dataclass
class TruncateRequest:
    """Everything ``truncate`` was asked to do, checked on construction before any file is read.

    Fields are :func:`truncate`'s parameters. ``strategy`` None becomes ``auto`` without ``keep`` and
    :data:`DEFAULT_STRATEGY` with it; an impossible combination raises ``ValueError`` in one line.
    """

    checkpoint: Path
    out: Path
    analysis: Path | None = None
    data: str = "mnist"
    eval_data: str | None = None
    strategy: str | None = None
    keep: int | None = None
    max_drop: float = DEFAULT_MAX_DROP
    budget: int = DEFAULT_BUDGET
    train_last: int | None = None
    epochs: int = HEAL_EPOCHS
    lr: float = HEAL_LR
    distill: bool = False
    metric: str | None = None
    images: int = 1000
    fmt: str = "pt"
    report: Path | None = None
    arch: str | None = None
    num_heads: int | None = None
    prefer_ema: bool = True
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    device: str = "cpu"
    seed: int = 0
    progress: bool = False

    def __post_init__(self) -> None:
        self.checkpoint, self.out = Path(self.checkpoint), Path(self.out)
        self.analysis = None if self.analysis is None else Path(self.analysis)
        self.report = None if self.report is None else Path(self.report)
        self.strategy = self.strategy or ("auto" if self.keep is None else DEFAULT_STRATEGY)
        if self.strategy not in ("auto", *STRATEGIES):
            raise ValueError(f"unknown strategy {self.strategy!r}; choose one of auto, {', '.join(STRATEGIES)}")
        if self.strategy == "auto" and self.keep is not None:
            raise ValueError("--keep fixes the depth; it cannot be combined with --strategy auto")
        check_search_options(self.max_drop, self.budget)
        if self.fmt not in ("pt", "safetensors"):
            raise ValueError(f"unknown format {self.fmt!r} (use 'pt' or 'safetensors')")
        if self.epochs < 0 or self.images < 4:
            raise ValueError(f"epochs must be at least 0 and images at least 4, got {self.epochs} and {self.images}")
        _check_paths({"checkpoint": self.checkpoint, "--analysis": self.analysis},
                     {"--out": self.out, "--report": self.report})
        if self.checkpoint.is_dir() and self.out.exists():
            raise ValueError(f"--out {self.out}: exists; a truncated Hugging Face model is written to a new directory")


class HealOptions(TypedDict, total=False):
    """Keyword arguments of :func:`heal`."""

    epochs: int
    lr: float
    teacher: nn.Module | None
    seed: int
    amp: bool
    train_last: int | None


@dataclass
class TruncationPlan:
    """What :func:`execute` will do, with everything it needs loaded: the uncut model, the images, the phases,
    the depth recommendation and the boundary distances the strategy reads. ``kept`` is the fixed strategy's
    cut (None for ``auto``, which searches)."""

    request: TruncateRequest
    checkpoint: Checkpoint
    uncut: nn.Module
    split: Split
    normalization: Normalization
    metric: str
    phases: Phases | None
    recommendation: DepthRecommendation | None
    distances: BoundaryDistances | None
    kept: list[int] | None

    @property
    def depth(self) -> int:
        return len(_blocks(self.uncut))

    @property
    def heal_options(self) -> HealOptions:
        """Keyword arguments of :func:`heal` for every cut of this plan."""
        r = self.request
        return {"epochs": r.epochs, "lr": r.lr, "teacher": self.uncut if r.distill else None, "seed": r.seed,
                "amp": r.device.startswith("cuda"), "train_last": r.train_last}


def plan(request: TruncateRequest) -> TruncationPlan:
    """Load the checkpoint and the images, analyse the uncut model where the strategy needs it and, for a fixed
    strategy, choose the blocks to keep. Refuses (``ValueError``) before any cut or healing."""
    r = request
    if r.checkpoint.is_dir():  # a Hugging Face save_pretrained directory
        uncut, data_config, info = load_pretrained_dir(r.checkpoint)
        ckpt = Checkpoint(r.checkpoint, info["arch"], {}, {}, info["sha256"], data_config=data_config)
    else:
        ckpt = load_checkpoint(r.checkpoint, arch=r.arch, num_heads=r.num_heads, prefer_ema=r.prefer_ema)
        uncut = build_model(ckpt)
    uncut = uncut.to(r.device).eval()
    depth = len(_blocks(uncut))
    if r.keep is not None and not 1 <= r.keep < depth:
        raise ValueError(f"--keep must be between 1 and {depth - 1} for this {depth}-block model, got {r.keep}")
    tapped = vit_parts(uncut).depth  # CaiT: its class-attention blocks follow the droppable ones
    source_analysis = _read_analysis(r.analysis, tapped, ckpt.sha256) if r.analysis is not None else None
    norm = resolve_normalization(uncut, r.data, ckpt.data_config, r.mean, r.std)
    split = load_split(uncut, r.data, r.eval_data, norm)
    metric = r.metric or (source_analysis.phase_metric if source_analysis else DEFAULT_PHASE_METRIC)
    if source_analysis is None and (r.keep is None or r.strategy == "plateau"):
        source_analysis = analyze(uncut, split.train_x[:r.images], split.train_y[:r.images], phase_metric=metric)
    if source_analysis is not None:
        source_analysis = source_analysis.first_blocks(depth)
    phases = _phases(source_analysis, metric) if source_analysis is not None else None
    recommendation = recommend_depth(source_analysis, r.max_drop / 100) if source_analysis is not None else None
    distances = (boundary_distances(uncut, split.train_x[:r.images]) if r.strategy in ("auto", "bi", "angular")
                 else None)
    kept = None
    if r.strategy != "auto":
        if r.strategy == "plateau" and phases is None:
            raise ValueError(f"no plateau in the {metric} curve of {r.checkpoint}; "
                             "pass --keep K or use --strategy auto, tail, bi, angular or random")
        assert r.strategy is not None  # TruncateRequest resolved None to a strategy
        keep = r.keep
        if keep is None:
            assert recommendation is not None  # without --keep the uncut model was analysed
            keep = recommendation.depth if r.strategy != "plateau" or phases is None else plateau_keep(phases, depth)
            if keep >= depth:
                raise ValueError(f"the analysis recommends keeping all {depth} blocks ({recommendation.signal}); "
                                 "pass --keep K to cut anyway, or use --strategy auto")
        kept = choose_blocks(r.strategy, depth, keep, phases=phases, distances=distances, seed=r.seed)
    return TruncationPlan(r, ckpt, uncut, split, norm, metric, phases, recommendation, distances, kept)


@dataclass
class Execution:
    """The healed cut: its kept source blocks, healing steps, the ``auto`` search record (None for a fixed
    strategy) and the images its accuracy is reported on (test for ``auto``, validation+test otherwise)."""

    model: nn.Module
    kept: list[int]
    healing_steps: int
    search: dict[str, Any] | None
    eval_x: Tensor
    eval_y: Tensor


def execute(plan: TruncationPlan) -> Execution:
    """Cut and heal: the planned blocks, or the ``auto`` search (:func:`auto_cut`)."""
    r, split = plan.request, plan.split
    if plan.kept is None:
        assert plan.recommendation is not None and plan.distances is not None  # plan() prepares both for auto
        model, kept, search = auto_cut(plan.uncut, split, plan.recommendation, plan.phases, plan.distances,
                                       r.max_drop, r.budget, r.seed, plan.heal_options, r.progress)
        steps = search["winner"]["healing_steps"] if search["winner"] else 0
        return Execution(model, kept, steps, search, split.test_x, split.test_y)
    model = cut_vit(plan.uncut, plan.kept)
    steps = heal(model, split.train_x, split.train_y, progress=r.progress, **plan.heal_options)
    return Execution(model, plan.kept, steps, None, *split.held_out)


def report(plan: TruncationPlan, execution: Execution) -> dict[str, Any]:
    """The report dict: costs and held-out accuracies of the uncut, cut and healed models
    (:func:`~isiwatch.truncation.truncate_report.measure`) and every choice made on the way."""
    r, kept, search, depth = plan.request, execution.kept, execution.search, plan.depth
    x = execution.eval_x
    reference, after = predict(plan.uncut, x), predict(execution.model, x)
    before = predict(cut_vit(plan.uncut, kept), x) if len(kept) < depth else reference
    result = measure(plan.checkpoint, plan.uncut, execution.model, x, execution.eval_y, reference, before, after)
    result.update({"strategy": r.strategy if search is None else f"auto: {search['winner_strategy']}",
                   "metric": plan.metric, "phases": plan.phases.to_dict() if plan.phases else None,
                   "recommendation": plan.recommendation.to_dict() if plan.recommendation else None,
                   "kept_blocks": kept, "dropped_blocks": sorted(set(range(depth)) - set(kept)),
                   "train_last": default_train_last(len(kept)) if r.train_last is None else r.train_last,
                   "epochs": r.epochs, "healing_steps": execution.healing_steps,
                   "lr": r.lr, "distill": r.distill, "data": plan.split.data, "weights": plan.checkpoint.weights,
                   "normalization": plan.normalization.to_dict(), "device": r.device, "seed": r.seed,
                   "output": str(r.out), "evaluated_on": "test" if search else "validation+test", "search": search})
    return result


def write(plan: TruncationPlan, execution: Execution, result: dict[str, Any]) -> list[Path]:
    """Write the healed model with its provenance metadata (a timm checkpoint, checked first to load strictly into
    ``timm.create_model``; for a Hugging Face directory a new ``save_pretrained`` directory), and the report when
    one was requested; returns the written paths."""
    r, ckpt = plan.request, plan.checkpoint
    metadata = {"kept_blocks": execution.kept, "source_sha256": ckpt.sha256, "source_checkpoint": str(ckpt.path),
                "source_depth": plan.depth, **{k: result[k] for k in ("strategy", "metric", "phases", "train_last",
                                                                        "epochs", "distill", "accuracy", "weights",
                                                                        "normalization", "data")}}
    if r.checkpoint.is_dir():
        paths = [save_pretrained_dir(execution.model, r.out, metadata)]
    else:
        model_kwargs = {**ckpt.model_kwargs, "depth": len(execution.kept)}
        state = {k: v.detach().cpu() for k, v in execution.model.state_dict().items()}
        timm.create_model(ckpt.arch, pretrained=False, **model_kwargs).load_state_dict(state, strict=True)
        paths = [save_checkpoint(r.out, ckpt.arch, model_kwargs, state, metadata, fmt=r.fmt)]
    if r.report is not None:
        paths.append(write_json(r.report, result))
    return paths


@dataclass
class TruncateResult:
    """The truncated model, the report dict (also written as JSON with ``report=``) and the written paths."""

    model: nn.Module
    report: dict[str, Any]
    paths: list[Path]


def truncate(checkpoint: str | Path, out: str | Path, **options: Any) -> TruncateResult:
    """Cut ``checkpoint`` down, heal it on ``data`` and write it to ``out``: :class:`TruncateRequest` (checks the
    options), :func:`plan`, :func:`execute`, :func:`report`, :func:`write`.

    ``strategy="auto"`` (the default without ``keep``) searches for the cheapest healed cut whose
    validation accuracy is at most ``max_drop`` points below the uncut model's, healing at most ``budget``
    candidates (:mod:`isiwatch.truncation.strategies`); when none qualifies the uncut weights are written. A fixed
    ``strategy`` (``bi`` by default with ``keep``) cuts to ``keep`` blocks; without ``keep``, ``plateau`` cuts
    the plateau of ``metric`` and the others cut to the recommended depth
    (:func:`isiwatch.measure.depth.recommend_depth`,
    from ``analysis`` or an analysis of ``images`` healing images). ``train_last`` defaults to the late
    half of the kept blocks; ``epochs`` of healing (0: cut only). ``eval_data`` (or ``data``'s own
    ``train/``+``validation/`` layout) separates healing from evaluation images (:func:`load_split`); images are
    normalised with ``mean``/``std``, else as the checkpoint records
    (:func:`~isiwatch.io.model_images.resolve_normalization`).
    The report and the output's metadata record the images, the normalisation and the weights (EMA or not)
    used. The input file is never written; outputs are written atomically, only after everything succeeded.
    """
    planned = plan(TruncateRequest(Path(checkpoint), Path(out), **options))
    execution = execute(planned)
    result = report(planned, execution)
    return TruncateResult(execution.model, result, write(planned, execution, result))


def auto_cut(uncut: nn.Module, split: Split, recommendation: DepthRecommendation, phases: Phases | None,
             distances: BoundaryDistances, max_drop: float, budget: int, seed: int, heal_options: HealOptions,
             progress: bool = False) -> tuple[nn.Module, list[int], dict[str, Any]]:
    """The cheapest qualifying healed cut of ``uncut`` (or a copy of it), its kept blocks and the search record.

    ``heal_options``: keyword arguments of :func:`heal`.
    """
    depth = len(_blocks(uncut))
    reference = accuracy(uncut, split.val_x, split.val_y)

    def blocks_for(strategy: str, keep: int) -> list[int] | None:
        if strategy == "plateau" and phases is None:
            return None
        return choose_blocks(strategy, depth, keep, phases=phases, distances=distances, seed=seed)

    def heal_and_score(strategy: str, kept: list[int]) -> tuple[float, float, int, nn.Module]:
        model = cut_vit(uncut, kept)
        cut = accuracy(model, split.val_x, split.val_y)
        steps = heal(model, split.train_x, split.train_y, **heal_options)
        return cut, accuracy(model, split.val_x, split.val_y), steps, model

    search = CutSearch(depth, reference, max_drop, budget, blocks_for, heal_and_score, progress=progress)
    winner = search.run(recommendation.kept_blocks)
    # costs depend only on the number of blocks kept: one cut per depth tried
    by_keep = {str(k): cut_vit(uncut, list(range(k))) for k in sorted({c.keep for c in search.candidates})}
    latency = measure_latency({"uncut": uncut, **by_keep}, split.val_x[:64].to(next(uncut.parameters()).device),
                              rounds=LATENCY_ROUNDS)
    costs = {k: {"parameters": count_parameters(m), "flops_per_image": forward_flops(m, split.val_x[:1]),
                 "latency_ms": latency[k]} for k, m in by_keep.items()}
    for c in search.candidates:
        c.extra = {**costs[str(c.keep)], "winner": c is winner}
    record = {"max_drop": max_drop, "budget": budget, "validation_images": len(split.val_y),
              "test_images": len(split.test_y), "uncut_validation_accuracy": reference,
              "uncut_latency_ms": latency["uncut"], "latency_batch": min(64, len(split.val_x)),
              "candidates": [c.to_dict() for c in search.candidates],
              "winner": winner.to_dict() if winner else None, "winner_strategy": winner.strategy if winner else "uncut",
              "message": None if winner else (f"no cut of the {depth}-block model stays within {max_drop:g} points "
                                              f"of its validation accuracy after {len(search.candidates)} "
                                              "candidates; wrote the uncut model")}
    if winner is None:
        return copy.deepcopy(uncut), list(range(depth)), record
    assert isinstance(search.best_model, nn.Module)  # the winner's healed model
    return search.best_model, winner.kept, record
