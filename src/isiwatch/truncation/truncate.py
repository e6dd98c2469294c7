"""``truncate``: cut a trained timm ViT down to fewer blocks and heal it by fine-tuning its late blocks.

The strategies that choose which blocks to keep are registered in `isiwatch.truncation.strategies`
(``plateau``, ``tail``, ``bi``, ``angular``, ``random``; ``auto`` searches over them); the surgery is
[`cut`][isiwatch.cut] and the healing [`heal`][isiwatch.heal], which freezes the
embeddings and the early kept blocks (in eval mode) and trains the late ``train_last`` kept blocks, the final norm
and the head with AdamW and a cosine schedule, optionally distilling the uncut model's logits. A written checkpoint
loads with ``timm.create_model(arch, **model_kwargs)`` and ``load_state_dict(strict=True)`` and records which source
blocks it kept.
"""

from __future__ import annotations

import copy
import json
import math
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import timm
from torch import Tensor, nn

from .._utils.files import write_json
from .._utils.option_error import OptionError
from ..io.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from ..io.models import build_model
from ..io.pretrained_dir import load_pretrained_dir, save_pretrained_dir
from ..io.timm_data import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_WORKERS,
    DataConfig,
    first_images,
    resolve_data_config,
    validate_py_command,
)
from ..measure.analysis import DEFAULT_PHASE_METRIC, Analysis, analyze
from ..measure.boundary_distances import BoundaryDistances
from ..measure.depth import DepthRecommendation, recommend_depth
from ..measure.phases import Phases
from ..taps import vit_parts
from .bridge import check_bridgeable
from .classifier_layout import block_list
from .confidence import AcceptanceRule, PairedDrop, SearchGuarantee, above_chance
from .cost import model_costs
from .data_split import NAMED, Data, Split, load_split
from .engine import FabricOptions
from .healing import HEAL_BATCH, Images, default_train_last, heal, predict
from .journal import SearchJournal
from .search import Candidate, CutSearch, Score, SearchProgress
from .strategies import (
    DEFAULT_BRIDGE,
    DEFAULT_BUDGET,
    DEFAULT_CONFIDENCE,
    DEFAULT_MAX_DROP,
    DEFAULT_STRATEGY,
    HEAL_EPOCHS,
    HEAL_LR,
    STRATEGIES,
    CutInputs,
    check_search_options,
    choose_blocks,
    get_strategy,
    inputs_needed,
)
from .surgery import CutRepair, cut_vit, least_repair, measure_inputs, repair_name
from .truncate_report import REPAIRS, candidates_table, measure, report_table

if TYPE_CHECKING:
    from lightning_fabric import Fabric

__all__ = ["STRATEGIES", "Data", "Execution", "Split", "TruncateRequest", "TruncateResult", "TruncationPlan",
           "auto_cut", "candidates_table", "choose_blocks", "cut_vit", "execute", "heal", "load_split", "plan",
           "report", "report_table", "truncate", "write"]

#: Timed rounds per candidate when ``auto`` measures latency.
LATENCY_ROUNDS = 10


def _read_analysis(path: Path, depth: int, sha256: str | None) -> Analysis:
    try:
        result = Analysis.from_dict(json.loads(Path(path).read_text()))
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"{path}: not a readable analysis.json ({type(exc).__name__}: {exc})") from None
    if sha256 is not None and result.model_info.get("sha256") not in (None, sha256):
        raise ValueError(f"{path}: analysis was computed on a different checkpoint (sha256 differs)")
    blocks = len(next(iter(result.layers.values()), []))
    if blocks != depth:
        raise ValueError(f"{path}: analysis has {blocks} blocks but the checkpoint has {depth}")
    return result


def _check_paths(inputs: dict[str, Path | None], outputs: dict[str, Path | None]) -> None:
    """Every output path differs from every input and from the other outputs (nothing is overwritten); the
    dictionaries map option names to paths."""
    seen = {Path(p).resolve(): name for name, p in inputs.items() if p is not None}
    for name, path in outputs.items():
        if path is None:
            continue
        clash = seen.get(Path(path).resolve())
        if clash is not None:
            kind = "input" if clash in inputs else "output"
            raise OptionError(f"{{path}}: {{{name}}} names the same file as the {kind} {{{clash}}}; choose another "
                              "path", path=path)
        seen[Path(path).resolve()] = name


@dataclass
class TruncateRequest:
    """Everything ``truncate`` was asked to do, checked on construction before any file is read.

    Fields are [`truncate`][isiwatch.truncate]'s parameters (``checkpoint``: its ``checkpoint_or_model``). ``strategy``
    None becomes ``auto`` without ``keep`` and `DEFAULT_STRATEGY` with it; an impossible combination raises
    ``ValueError`` (an `OptionError` naming the parameters) in one line.
    """

    checkpoint: Path | nn.Module
    out: Path | None = None
    analysis: Path | None = None
    data: Data = "mnist"
    eval_data: Data | None = None
    strategy: str | None = None
    keep: int | None = None
    max_drop: float = DEFAULT_MAX_DROP
    confidence: float = DEFAULT_CONFIDENCE
    budget: int = DEFAULT_BUDGET
    train_last: int | None = None
    epochs: int = HEAL_EPOCHS
    heal_steps: int | None = None
    bridge: str = DEFAULT_BRIDGE
    journal: Path | None = None
    resume: bool = False
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
    batch_size: int = DEFAULT_BATCH_SIZE
    workers: int = DEFAULT_WORKERS
    devices: int = 1
    num_nodes: int = 1
    dist_strategy: str = "auto"
    precision: str | None = None
    echo: Callable[[str], None] | None = None
    class_map: Path | dict[str, int] | None = None

    @property
    def fabric_options(self) -> FabricOptions:
        """Where healing and evaluation run: ``device``'s accelerator, ``devices``, ``num_nodes``,
        ``dist_strategy`` and ``precision``."""
        return FabricOptions(self.device.split(":")[0], self.devices, self.num_nodes, self.dist_strategy,
                             self.precision)

    def __post_init__(self) -> None:
        if not isinstance(self.checkpoint, nn.Module):
            self.checkpoint = Path(self.checkpoint)
        self.out, self.analysis, self.report, self.journal = (
            None if p is None else Path(p) for p in (self.out, self.analysis, self.report, self.journal))
        self.strategy = self.strategy or ("auto" if self.keep is None else DEFAULT_STRATEGY)
        if self.strategy != "auto":
            get_strategy(self.strategy)
        elif self.keep is not None:
            raise OptionError("{keep} fixes the depth; it cannot be combined with {strategy:'auto'}")
        check_search_options(self.max_drop, self.budget, self.confidence, self.heal_steps, self.bridge)
        if self.resume and self.journal is None:
            raise OptionError("{resume} continues the search journalled in {journal}; give one (the command line "
                              "keeps it beside {out})")
        if self.fmt not in ("pt", "safetensors"):
            raise ValueError(f"unknown format {self.fmt!r} (use 'pt' or 'safetensors')")
        if self.epochs < 0 or self.images < 4:
            raise ValueError(f"epochs must be at least 0 and images at least 4, got {self.epochs} and {self.images}")
        if self.batch_size < 1 or self.workers < 0:
            raise OptionError("{batch_size} must be at least 1 and {workers} at least 0, got {size} and {count}",
                              size=self.batch_size, count=self.workers)
        self.fabric_options  # noqa: B018  (checks the distributed options)
        if isinstance(self.checkpoint, nn.Module) and self.out is not None:
            raise OptionError("{out} writes a checkpoint rebuilt from the input checkpoint's architecture; a model "
                              "object has none: save the result's model yourself")
        if self.mean is not None and not isinstance(self.data, NAMED):
            raise OptionError("{mean} and {std} normalise images read from a name or a folder; tensors and "
                              "DataLoaders are used as they are")
        if self.class_map is not None and not isinstance(self.class_map, dict):
            self.class_map = _read_class_map(Path(self.class_map))  # before the checkpoint or any image is read
        path = None if isinstance(self.checkpoint, nn.Module) else self.checkpoint
        _check_paths({"checkpoint": path, "analysis": self.analysis},
                     {"out": self.out, "report": self.report, "journal": self.journal})
        if path is not None and path.is_dir() and self.out is not None and self.out.exists():
            raise OptionError("{out} {path}: exists; a truncated Hugging Face model is written to a new directory",
                              path=self.out)


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
    def heal_options(self) -> HealOptions:
        """Keyword arguments of [`heal`][isiwatch.heal] for every cut of this plan."""
        r = self.request
        return {"lr": r.lr, "teacher": self.uncut if r.distill else None, "seed": r.seed,
                "amp": r.device.startswith("cuda"), "train_last": r.train_last}

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps of one pass over the healing images (`_steps_per_epoch`)."""
        return _steps_per_epoch(self.split)

    @property
    def heal_steps(self) -> int:
        """Optimizer steps of a full heal: ``heal_steps``, else ``epochs`` passes over the healing images."""
        return _heal_steps(self.request, self.split)

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


def _steps_per_epoch(split: Split) -> int:
    """Optimizer steps of one pass over the healing images: the loader's batches (this process's shard), or
    batches of `HEAL_BATCH` of a tensor."""
    images = split.train_x
    return max(1, math.ceil(len(images) / HEAL_BATCH) if isinstance(images, Tensor) else len(images))


def _heal_steps(request: TruncateRequest, split: Split) -> int:
    """Optimizer steps of a full heal (`TruncationPlan.heal_steps`)."""
    r = request
    return r.heal_steps if r.heal_steps is not None else r.epochs * _steps_per_epoch(split)


def search_guarantee(request: TruncateRequest) -> SearchGuarantee:
    """The ``auto`` search's error control: ``max_drop`` at ``confidence``, one fixed sequence."""
    return SearchGuarantee(request.max_drop, request.confidence)


def _check_certifiable(request: TruncateRequest, guarantee: SearchGuarantee, images: int) -> str:
    """The line that says what the ``auto`` search can certify on ``images`` validation images; an
    `OptionError` when it can certify nothing (before any analysis or healing)."""
    r, needed = request, guarantee.images_needed()
    points = f"{r.max_drop:g} point{'' if r.max_drop == 1 else 's'}"
    if r.confidence == 0:
        return (f"auto: {images} validation images; a cut qualifies when its validation drop is within {points} "
                "(a point estimate, nothing certified)")
    confidence = f"{100 * r.confidence:g} %"
    if needed is None:
        raise OptionError("{max_drop:0}: no number of validation images certifies a cut that loses nothing at "
                          "{confidence} above 0; allow a drop above 0 points or give {confidence:0}")
    if images < needed:
        raise OptionError("{count} validation images cannot certify any cut within {points} at {level} "
                          "confidence: even a cut that changes no prediction needs {needed}; give more validation "
                          "images ({eval_data}), a larger {max_drop} or {confidence:0}", count=images,
                          points=points, level=confidence, needed=needed)
    return (f"auto: {images} validation images; a cut that changes no prediction needs {needed} to be certified "
            f"within {points} at {confidence} confidence")


def _read_class_map(path: Path) -> dict[str, int]:
    """A class map file: a JSON object of class folder name → model output index, or a JSON list of the class
    names in output order; refused in one line."""
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise OptionError("{class_map} {path}: not a readable JSON file ({why})", path=path,
                          why=str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return {name: i for i, name in enumerate(value)}
    if isinstance(value, dict) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                       for v in value.values()):
        return {str(k): v for k, v in value.items()}
    raise OptionError("{class_map} {path}: not a JSON object of class folder name to output index (or a list of "
                      "the class names in output order)", path=path)


def _class_map(request: TruncateRequest, ckpt: Checkpoint) -> dict[str, int] | None:
    """The class map to number class folders by: the given one, else the one the checkpoint records."""
    if isinstance(request.class_map, dict):  # TruncateRequest read a file into one
        return dict(request.class_map)
    recorded = ckpt.metadata.get("class_map")
    return {str(k): int(v) for k, v in recorded.items()} if isinstance(recorded, dict) and recorded else None


def _check_labels(request: TruncateRequest, uncut: nn.Module, split: Split) -> Tensor:
    """Before ``auto`` certifies anything: decode every validation and test image (a bad one is refused now,
    not after the search) and refuse, in one line, an uncut model that is not above chance on the validation
    split (labels that do not match its outputs). "Above chance" is the one-sided exact test at the run's
    confidence (95 % with ``confidence`` 0) that its accuracy exceeds the share of the commonest validation
    class. Returns the uncut model's test predictions."""
    labels = split.val_y
    correct = int((predict(uncut, split.val_x) == labels).sum())
    test = predict(uncut, split.test_x)
    images, chance = len(labels), float(labels.bincount().max()) / max(1, len(labels))
    confidence = request.confidence or DEFAULT_CONFIDENCE
    if not above_chance(correct, images, chance, 1 - confidence):
        how = split.labels.get("numbering")
        raise OptionError("the uncut model scores {accuracy} on the {images} validation images, not above chance "
                          "({chance}, the commonest class's share) at {level} confidence: its outputs do not match "
                          "these labels" + (f" (classes numbered by {how})" if how else "")
                          + "; give {class_map:FILE} (class folder name to output index) or images of its classes",
                          accuracy=f"{correct / images:.3f}", images=images, chance=f"{chance:.3f}",
                          level=f"{100 * confidence:g} %")
    return test


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


def _check_train_last(request: TruncateRequest, keep: int) -> None:
    """Refuse a ``train_last`` above ``keep``, the most blocks a cut keeps (``auto``: depth − 1; its smaller cuts
    train all of theirs)."""
    if request.train_last is not None and request.train_last > keep:
        raise OptionError("{train_last} must be at most {keep}, the blocks the cut keeps, got {value}",
                          keep=keep, value=request.train_last)


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
    if depth < 2:
        raise OptionError("{source} has {blocks}: nothing can be cut from it (truncate needs at least 2)",
                          source=ckpt.path, blocks=f"{depth} block" + ("" if depth == 1 else "s"))
    if r.keep is not None and not 1 <= r.keep < depth:
        raise OptionError("{keep} must be between 1 and {top} for this {depth}-block model, got {value}",
                          top=depth - 1, depth=depth, value=r.keep)
    _check_train_last(r, r.keep or depth - 1)
    tapped = vit_parts(uncut).depth  # CaiT: its class-attention blocks follow the droppable ones
    source_analysis = _read_analysis(r.analysis, tapped, ckpt.sha256 or None) if r.analysis is not None else None
    norm = (resolve_data_config(uncut, str(r.data), ckpt.data_config, r.mean, r.std)
            if isinstance(r.data, NAMED) else None)
    split = load_split(uncut, r.data, r.eval_data, norm, batch_size=r.batch_size, workers=r.workers, seed=r.seed,
                       fabric=fabric, class_map=_class_map(r, ckpt))
    uncut_test = None
    if r.strategy == "auto":
        line = _check_certifiable(r, search_guarantee(r), len(split.val_y))
        if r.bridge != "none":
            check_bridgeable(uncut, first_images(split.probe_x, 2)[0].to(fabric.device))
        uncut_test = _check_labels(r, uncut, split)
        if r.echo is not None and fabric.is_global_zero:
            r.echo(line)
    metric = r.metric or (source_analysis.phase_metric if source_analysis else DEFAULT_PHASE_METRIC)
    needs = inputs_needed(r.strategy)
    probe_x, probe_y = first_images(split.probe_x, r.images)
    if source_analysis is None and (r.keep is None or "phases" in needs):  # the recommendation reads it too
        source_analysis = analyze(uncut, probe_x, probe_y, phase_metric=metric)
    if source_analysis is not None:
        source_analysis = source_analysis.first_blocks(depth)
    inputs = measure_inputs(uncut, probe_x, needs, analysis=source_analysis, metric=metric, seed=r.seed)
    recommendation = recommend_depth(source_analysis, r.max_drop / 100) if source_analysis is not None else None
    kept = None
    if r.strategy != "auto":
        chosen = get_strategy(r.strategy)
        if chosen.missing(inputs):  # all was measured: the curve has no plateau
            others = ["auto", *(name for name, s in STRATEGIES.items() if "phases" not in s.needs)]
            raise OptionError("no plateau in the {metric} curve of {source}; use {strategy} "
                              + ", ".join(others[:-1]) + " or " + others[-1], metric=metric, source=ckpt.path)
        keep = r.keep
        if keep is None:
            assert recommendation is not None  # without keep the uncut model was analysed
            keep = chosen.default_keep(depth, inputs) if chosen.default_keep else recommendation.depth
            if keep >= depth:
                raise OptionError("the analysis recommends keeping all {depth} blocks ({signal}); pass {keep:K} to "
                                  "cut anyway, or use {strategy:'auto'}", depth=depth, signal=recommendation.signal)
        _check_train_last(r, keep)
        kept = choose_blocks(r.strategy, depth, keep, phases=inputs.phases, distances=inputs.distances, seed=r.seed)
    return TruncationPlan(r, ckpt, uncut, split, norm, fabric, metric, inputs.phases, recommendation, inputs.distances,
                          kept, uncut_test)


@dataclass
class Execution:
    """The healed cut: its kept source blocks, healing steps, the ``auto`` search record (None for a fixed
    strategy), the images its accuracy is reported on (test for ``auto``, validation+test otherwise) and whether
    the cut was bridged (then never healed: the report's "bridged cut" row is the model)."""

    model: nn.Module
    kept: list[int]
    healing_steps: int
    search: dict[str, Any] | None
    eval_x: Images
    eval_y: Tensor
    bridged: bool = False
    #: `measure_costs` of the uncut model and every depth tried, filled in by `execute`.
    costs: dict[str, dict[str, Any]] = field(default_factory=dict)


def execute(plan: TruncationPlan) -> Execution:
    """Cut and heal: the planned blocks, or the ``auto`` search (`auto_cut`); then the costs of every depth
    tried (`measure_costs`)."""
    r, split = plan.request, plan.split
    if plan.kept is None:
        model, kept, search = auto_cut(plan)
        bridged = search["winner"] is not None and search["winner"]["bridge"] is not None
        execution = Execution(model, kept, search["healing_steps"], search, split.test_x, split.test_y, bridged)
        depths = {c["keep"] for c in search["candidates"]}
    else:
        model = cut_vit(plan.uncut, plan.kept)
        steps = plan.heal(model, plan.heal_steps, progress=r.progress)
        execution = Execution(model, plan.kept, steps, None, *split.held_out)
        depths = set()
    execution.costs = measure_costs(plan, depths | {len(execution.kept)}, execution.eval_x)
    if execution.search is not None:
        for c in execution.search["candidates"]:
            c.update({k: v for k, v in execution.costs[str(c["keep"])].items() if k != "blocks"})
    return execution


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


def report(plan: TruncationPlan, execution: Execution) -> dict[str, Any]:
    """The report dict: costs and held-out accuracies of every model the run made (`stage_predictions`,
    `measure`) and every choice made on the way."""
    r, kept, search, depth = plan.request, execution.kept, execution.search, plan.depth
    stages = stage_predictions(plan, execution)
    reference, after = stages["uncut"], list(stages.values())[-1]
    result = measure(plan.checkpoint, execution.costs["uncut"], execution.costs[str(len(kept))],
                     "test" if search else "validation+test", execution.eval_y, stages)
    strategy = r.strategy if search is None else \
        f"auto: {search['winner_strategy']}" if search["winner"] else "auto: nothing cut"
    result.update({"strategy": strategy,
                   "metric": plan.metric, "phases": plan.phases.to_dict() if plan.phases else None,
                   "recommendation": plan.recommendation.to_dict() if plan.recommendation else None,
                   "kept_blocks": kept, "dropped_blocks": sorted(set(range(depth)) - set(kept)),
                   "train_last": default_train_last(len(kept)) if r.train_last is None else min(r.train_last,
                                                                                                  len(kept)),
                   "epochs": r.epochs, "heal_steps": plan.heal_steps, "healing_steps": execution.healing_steps,
                   "lr": r.lr, "distill": r.distill, "data": plan.split.data, "weights": plan.checkpoint.weights,
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
    if search is not None and search["winner"] is None:
        search["to_certify"] = to_certify(search, plan.guarantee)
    if search is not None:  # the winner (or the uncut model) scored once on the test split
        labels = execution.eval_y
        drop = PairedDrop.from_correct((reference == labels).tolist(), (after == labels).tolist())
        search["test"] = {"points": 100 * drop.drop, **drop.to_dict(),
                          "within_max_drop": 100 * drop.drop <= r.max_drop + 1e-9}
    return result


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


def _write_model(plan: TruncationPlan, execution: Execution, result: dict[str, Any], out: Path) -> Path:
    """The healed model with its provenance metadata: a new ``save_pretrained`` directory for a Hugging Face
    source, else a timm checkpoint, checked first to load strictly into ``timm.create_model``."""
    r, ckpt = plan.request, plan.checkpoint
    metadata = {"kept_blocks": execution.kept, "source_sha256": ckpt.sha256, "source_checkpoint": str(ckpt.path),
                "source_depth": plan.depth, **{k: result[k] for k in ("strategy", "metric", "phases", "train_last",
                                                                        "epochs", "distill", "accuracy", "weights",
                                                                        "normalization", "data")},
                **({"class_map": plan.split.labels["classes"]} if plan.split.labels else {})}
    if ckpt.path.is_dir():
        return save_pretrained_dir(execution.model, out, metadata)
    model_kwargs = cut_model_kwargs(plan, execution)
    state = {k: v.detach().cpu() for k, v in execution.model.state_dict().items()}
    timm.create_model(ckpt.arch, pretrained=False, **model_kwargs).load_state_dict(state, strict=True)
    return save_checkpoint(out, ckpt.arch, model_kwargs, state, metadata, fmt=r.fmt)


def cut_model_kwargs(plan: TruncationPlan, execution: Execution) -> dict[str, Any]:
    """``timm.create_model`` keyword arguments of the written cut: the source's at the cut depth, with the data
    config as ``pretrained_cfg_overlay`` so ``timm.data.resolve_data_config(model=...)`` gives its preprocessing."""
    kwargs = {**plan.checkpoint.model_kwargs, "depth": len(execution.kept)}
    if plan.normalization is not None:
        kwargs["pretrained_cfg_overlay"] = plan.normalization.pretrained_cfg()
    return kwargs


def write(plan: TruncationPlan, execution: Execution, result: dict[str, Any]) -> list[Path]:
    """Write the healed model (`_write_model`) and the report, each when requested, from process 0 only;
    returns the written paths. A run that certified no cut writes its report (the record of the decision) but no
    model, and leaves no journal."""
    r = plan.request
    if not plan.fabric.is_global_zero:  # every process healed the same weights; one writes them
        return []
    paths = []
    if not certified(result):  # a copy of the input would pass for a cut: no model file
        if r.journal is not None:
            r.journal.unlink(missing_ok=True)
    elif r.out is not None:
        paths.append(_write_model(plan, execution, result, r.out))
    if r.report is not None:
        paths.append(write_json(r.report, result))
    return paths


def certified(report: dict[str, Any]) -> bool:
    """Whether a report's run cut the model: a fixed strategy always does; ``auto`` only when it certified a
    cut (else it writes nothing)."""
    search = report.get("search")
    return not isinstance(search, dict) or search.get("winner") is not None


@dataclass
class TruncateResult:
    """The truncated model, the report dict (also written as JSON with ``report=``), the written paths and whether
    this process is the one that writes (process 0 of a distributed run). ``cut`` is False when ``auto``
    certified no cut: ``model`` is then the uncut model, no model file was written (the report was, when asked
    for), and ``report["search"]`` says why (``message``) and what would certify the nearest candidate
    (``to_certify``)."""

    model: nn.Module
    report: dict[str, Any]
    paths: list[Path]
    writer: bool = True
    cut: bool = True


def truncate(
    checkpoint_or_model: str | Path | nn.Module,
    out: str | Path | None = None,
    *,
    data: Data = "mnist",
    eval_data: Data | None = None,
    strategy: str | None = None,
    keep: int | None = None,
    max_drop: float = DEFAULT_MAX_DROP,
    confidence: float = DEFAULT_CONFIDENCE,
    budget: int = DEFAULT_BUDGET,
    train_last: int | None = None,
    epochs: int = HEAL_EPOCHS,
    heal_steps: int | None = None,
    bridge: str = DEFAULT_BRIDGE,
    journal: str | Path | None = None,
    resume: bool = False,
    lr: float = HEAL_LR,
    distill: bool = False,
    analysis: str | Path | None = None,
    metric: str | None = None,
    images: int = 1000,
    fmt: str = "pt",
    report: str | Path | None = None,
    arch: str | None = None,
    num_heads: int | None = None,
    prefer_ema: bool = True,
    mean: tuple[float, ...] | None = None,
    std: tuple[float, ...] | None = None,
    device: str = "cpu",
    seed: int = 0,
    progress: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
    workers: int = DEFAULT_WORKERS,
    devices: int = 1,
    num_nodes: int = 1,
    dist_strategy: str = "auto",
    precision: str | None = None,
    echo: Callable[[str], None] | None = None,
    class_map: str | Path | dict[str, int] | None = None,
) -> TruncateResult:
    """Cut a trained ViT down to fewer blocks and heal it by fine-tuning its late blocks.

    By default (``auto``, `isiwatch.truncation.search`) it searches for the cheapest cut, as it is or healed,
    whose accuracy drop is certified within ``max_drop`` points of the uncut model's on the validation images (the
    upper ``confidence`` bound of the paired drop, `isiwatch.truncation.confidence`), heals a healed winner fully
    and scores the winner once on the test images; when none qualifies, nothing is written and the result's
    ``cut`` is False (its model the uncut one, its report saying what would certify the nearest candidate). The steps
    are `TruncateRequest` (checks the options before anything is read), `plan`, `execute`, `report` and `write`;
    [`cut`][isiwatch.cut] and [`heal`][isiwatch.heal] do the surgery and the healing on their own. The input is
    never written; outputs are written atomically, only after everything succeeded.

    Args:
        checkpoint_or_model: A timm ViT classifier (an ``nn.Module``, moved to ``device`` and put in eval mode but
            otherwise untouched), a checkpoint file (timm ``train.py``, isiwatch, Lightning, safetensors) or a
            Hugging Face ``save_pretrained`` directory.
        out: Where to write the healed model (a new directory for a Hugging Face source); None writes nothing.
            Only for a checkpoint or directory: a model object has no architecture record to rebuild from.
        data: Healing and held-out images: ``"mnist"`` (the embedded digits), a folder tree or tar file that
            ``timm.data.create_dataset`` reads (20 % held out, unless it has ``train/`` and ``validation/``
            sub-folders), a split of a dataset timm's readers read (`TimmDataset`,
            e.g. ``TimmDataset("torch/cifar10", root, "train")``; held out as a folder is), model-ready
            ``(images, labels)`` tensors (the last 20 % held out) or a DataLoader of such batches (its dataset
            split the same way, read in its batch size and workers). Images are streamed,
            never all held in memory; those read from a name or a folder are preprocessed as timm's ``train.py``
            (healing) and ``validate.py`` (evaluation) would for this checkpoint.
        eval_data: Images to validate and test on (halved), in any form ``data`` takes; all of ``data`` then heals.
        strategy: Which blocks to keep: ``"auto"`` (the default without ``keep``) or a name in
            `STRATEGIES` (``"bi"`` by default with ``keep``).
        keep: Blocks to keep, for a fixed strategy; None: the plateau cut's depth for ``plateau``, the recommended
            depth ([`recommend_depth`][isiwatch.recommend_depth]) for the others.
        max_drop: ``auto``: accuracy points a cut may lose.
        confidence: ``auto``: confidence that no certified cut loses more than ``max_drop`` (exact bounds of the
            paired drop, fixed-sequence testing; `isiwatch.truncation.confidence`); 0: the observed validation
            drop (a point estimate). Refused before any healing when the validation images cannot certify even
            a cut that changes no prediction.
        budget: ``auto``: candidates healed at most (each in full); cuts tested as they are or bridged cost no
            healing.
        train_last: Kept blocks to fine-tune, counted from the end (``auto``'s cuts that keep fewer train all of
            theirs); None: the late half.
        epochs: Healing epochs (0: cut only), when ``heal_steps`` is None.
        heal_steps: Optimizer steps of a full heal (batches of 128 images); None: ``epochs`` passes.
        bridge: ``auto``: the linear bridge that repairs a cut without training (`isiwatch.truncation.bridge`):
            ``"lstsq"`` (least squares, closed form), ``"cosine"`` (ReplaceMe's cosine-distance refinement) or
            ``"none"``; fitted on the first ``images`` healing images and merged into the kept block before each
            dropped run, so the cut stays a plain shallower model. Each candidate's repair is chosen on those
            images, the least first: as it is, bridged, then healed (`CutRepair`); the guarantee is unchanged.
        journal: ``auto``: a JSON-lines file the search appends each finished candidate to.
        resume: ``auto``: take the candidates an interrupted run of the same search left in ``journal``
            instead of healing them again.
        lr: Peak healing learning rate.
        distill: Also distil the uncut model's logits while healing.
        analysis: An ``analysis.json`` of this model (default: analyse it on ``images`` healing images).
        metric: The curve whose plateau ``plateau`` cuts (default: the analysis's, else token_similarity).
        images: Healing images the analysis, the block scores and the bridge are measured on.
        fmt: Checkpoint format of ``out``: ``"pt"`` or ``"safetensors"``.
        report: Also write the report as JSON here.
        arch: timm architecture of a checkpoint that records none (default: inferred).
        num_heads: Attention heads of a checkpoint that records neither them nor an architecture.
        prefer_ema: Read a checkpoint's ``state_dict_ema`` when it has one.
        mean: Per-channel mean for images read from a name or a folder (with ``std``; default: as the checkpoint
            records, `resolve_data_config`).
        std: Per-channel standard deviation, with ``mean``.
        device: Where to measure and heal (``"cpu"``, ``"cuda"``): Lightning Fabric's accelerator.
        seed: Healing order and ``random`` strategy seed.
        progress: Show progress bars.
        batch_size: Images per batch for images read from a name or a folder, over all processes: each of
            ``devices`` × ``num_nodes`` processes reads its share, so several devices heal with the batch one does
            (the report's ``batch`` records it).
        workers: DataLoader worker processes reading images (0: in this process).
        devices: Devices (processes) per node that heal and evaluate, each on its shard of the images; with
            more than one and no torchrun or SLURM around it, Fabric starts the others by re-running this script.
        num_nodes: Nodes, under torchrun or SLURM.
        dist_strategy: Fabric's strategy: ``"auto"``, ``"ddp"`` or ``"fsdp"``.
        precision: ``"32"``, ``"16-mixed"`` or ``"bf16-mixed"`` (None: bf16-mixed on CUDA, else 32).
        echo: Called (by process 0) with the line that says, before any healing, what ``auto`` can certify on
            the validation images.
        class_map: How class folders map to the model's outputs: a dict or a JSON file of folder name → output
            index (or a JSON list of names in output order); None: the checkpoint's recorded ``class_map``, else
            numeric folder names as indices, else timm's sorted-name numbering. ``auto`` refuses, before any
            healing, an uncut model not above chance on the validation split (one-sided exact test at
            ``confidence``): its labels do not match.

    Returns:
        The truncated model, the report dict (costs, accuracies, every choice made, the ``auto`` search) and the
        written paths.

    Raises:
        ValueError: An impossible option or combination, unreadable inputs or images, a model that cannot be cut;
            raised before any healing, in one line that names the parameters.
    """
    source = checkpoint_or_model if isinstance(checkpoint_or_model, nn.Module) else Path(checkpoint_or_model)
    return _run(TruncateRequest(
        source, out=None if out is None else Path(out), analysis=None if analysis is None else Path(analysis),
        data=data, eval_data=eval_data, strategy=strategy, keep=keep, max_drop=max_drop, confidence=confidence,
        budget=budget, train_last=train_last, epochs=epochs, heal_steps=heal_steps,
        bridge=bridge, journal=None if journal is None else Path(journal), resume=resume, lr=lr, distill=distill,
        metric=metric, images=images, fmt=fmt,
        report=None if report is None else Path(report), arch=arch, num_heads=num_heads, prefer_ema=prefer_ema,
        mean=mean, std=std, device=device, seed=seed, progress=progress, batch_size=batch_size, workers=workers,
        devices=devices, num_nodes=num_nodes, dist_strategy=dist_strategy, precision=precision, echo=echo,
        class_map=None if class_map is None or isinstance(class_map, dict) else Path(class_map)))


def _run(request: TruncateRequest) -> TruncateResult:
    """`plan`, `execute`, `report` and `write` (out of [`truncate`][isiwatch.truncate], whose ``report``
    parameter hides the function)."""
    planned = plan(request)
    execution = execute(planned)
    result = report(planned, execution)
    return TruncateResult(execution.model, result, write(planned, execution, result), planned.fabric.is_global_zero,
                          certified(result))


def _search_header(plan: TruncationPlan, guarantee: SearchGuarantee, uncut_correct: Tensor) -> dict[str, Any]:
    """What a journal records its search was: a resumed search must be this one to reuse its candidates."""
    r = plan.request
    return {"source_sha256": plan.checkpoint.sha256, "depth": plan.depth,
            "data": plan.split.data, "uncut_validation_correct": int(uncut_correct.sum()),
            "rule": guarantee.to_dict(), "budget": r.budget, "heal_steps": plan.heal_steps, "bridge": r.bridge,
            "images": r.images, "lr": r.lr, "distill": r.distill,
            "train_last": r.train_last, "seed": r.seed, "metric": plan.metric}


def _timing_batch(images: Images) -> Tensor:
    """The first 64 images (a tensor's or a loader's): the batch latencies and FLOPs are measured on."""
    return images[:64] if isinstance(images, Tensor) else first_images(images, 64)[0]


def _points(fraction: float) -> str:
    value = 100 * fraction
    return f"{value:.2f} point{'' if value == 1 else 's'}"


def auto_cut(plan: TruncationPlan) -> tuple[nn.Module, list[int], dict[str, Any]]:
    """The cheapest certified cut of the plan's uncut model (or a copy of it), its kept blocks, the search
    record (`isiwatch.truncation.search`).

    Each cut of the fixed order is repaired as `CutRepair` chooses on the healing images (as it is, bridged, or
    healed in full from the cut as it is, `TruncationPlan.heal_steps`) and tested, in that one sequence, by
    `TruncationPlan.guarantee`; the winner's model is the one it tested. The search journal (``journal``) makes an
    interrupted search resumable (``resume``).
    """
    r, split, uncut = plan.request, plan.split, plan.uncut
    assert plan.distances is not None  # plan() measures them for auto
    depth = plan.depth
    uncut_correct = predict(uncut, split.val_x) == split.val_y
    reference = float(uncut_correct.float().mean())
    full = plan.heal_steps
    guarantee = plan.guarantee
    inputs = CutInputs(plan.phases, plan.distances, r.seed)

    def blocks_for(strategy: str, keep: int) -> list[int] | None:
        if STRATEGIES[strategy].missing(inputs):  # plateau without a plateau
            return None
        return choose_blocks(strategy, depth, keep, phases=plan.phases, distances=plan.distances, seed=r.seed)

    repair = CutRepair(uncut, *first_images(split.probe_x, r.images), r.bridge)

    def score(kept: list[int], may_heal: bool) -> Score:
        heal = (lambda model: plan.heal(model, full)) if may_heal and full > 0 else None
        choice = repair.choose(kept, guarantee.rule, len(split.val_y), heal)
        correct = predict(choice.model, split.val_x) == split.val_y
        before = predict(repair.variants(kept)["cut"][0], split.val_x) == split.val_y if choice.steps else correct
        return Score(float(before.float().mean()), float(correct.float().mean()),
                     PairedDrop.from_correct(uncut_correct.tolist(), correct.tolist()), choice.steps, choice.repair,
                     choice.record, choice.bridge, choice.model)

    record: dict[str, Any] = {
        "max_drop": r.max_drop, "confidence": r.confidence, "rule": guarantee.to_dict(), "budget": r.budget,
        "heal_steps": full, "validation_images": len(split.val_y),
        "test_images": len(split.test_y), "uncut_validation_accuracy": reference,
        "journal": None if r.journal is None else str(r.journal), "resumed_candidates": 0, "candidates": [],
        "winner": None, "winner_strategy": "uncut", "stopped_at": None, "healing_steps": 0}
    journal = SearchJournal(r.journal, _search_header(plan, guarantee, uncut_correct), resume=r.resume)
    progress = SearchProgress(r.budget * full, r.budget, r.progress)
    search = CutSearch(depth, guarantee, r.budget, blocks_for, lambda _strategy, kept, may_heal: score(kept, may_heal),
                       journal=journal, progress=progress)
    try:
        winner = search.run()
        model = _winner_model(search, winner, score)
    except ValueError:  # a refusal (an interrupted or crashed search keeps its journal to resume from)
        journal.discard()
        raise
    finally:
        progress.close()
    record["resumed_candidates"] = sum(c.resumed for c in search.candidates)
    for c in search.candidates:
        c.extra = {"winner": c is winner}
    stopped = search.stopped_at
    record.update({"candidates": [c.to_dict() for c in search.candidates], "order": len(search.fixed_order()),
                   "stopped_at": None if stopped is None else stopped.keep,
                   "winner": winner.to_dict() if winner else None, "bridge": repair.to_dict(),
                   "winner_strategy": winner.strategy if winner else "uncut",
                   "healing_steps": winner.healing_steps if winner else 0})
    if winner is None:
        closest = search.closest()
        record["message"] = (f"no cut: no cut of the {depth}-block model was certified within {r.max_drop:g} "
                             f"point{'' if r.max_drop == 1 else 's'} after {len(search.candidates)} candidates"
                             + ("" if closest is None else
                                f"; the closest, {closest.strategy} keeping {closest.keep} blocks "
                                f"{REPAIRS[closest.repair]}, dropped "
                                f"{_points(closest.drop.drop)} on validation with an upper bound of "
                                f"{_points(closest.bound)}"))
        return copy.deepcopy(uncut), list(range(depth)), record
    record["message"] = None
    assert isinstance(model, nn.Module)
    return model, winner.kept, record


def _winner_model(search: CutSearch, winner: Candidate | None,
                  score: Callable[[list[int], bool], Score]) -> nn.Module | None:
    """The model the winner was tested as; one read back from a journal is repaired again (the same choice on
    the same healing images, the same seeded heal)."""
    if winner is None:
        return None
    if isinstance(search.best_model, nn.Module):
        return search.best_model
    model = score(winner.kept, winner.healing_steps > 0).model
    assert isinstance(model, nn.Module)
    return model
