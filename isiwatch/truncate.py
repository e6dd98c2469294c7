"""``truncate``: cut a trained timm ViT down to fewer blocks and heal it by fine-tuning its late blocks.

Strategies choose which blocks to keep:

- ``plateau``: drop the blocks that sit on the plateau of a per-layer curve (SPEC §8). The curve is measured
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
from dataclasses import dataclass, field
from pathlib import Path

import timm
import torch
from torch import Tensor, nn

from .analysis import DEFAULT_PHASE_METRIC, Analysis, analyze
from .block_scores import BoundaryDistances, angular_distance, block_influence, boundary_distances
from .checkpoint import load_checkpoint, save_checkpoint
from .cost import count_parameters, forward_flops, measure_latency
from .cut_search import DEFAULT_BUDGET, DEFAULT_MAX_DROP, CutSearch, check_search_options
from .data import DIGITS_TRAIN, DataError, Normalization, embedded_digits, fit_to_model, renormalize
from .depth import DepthRecommendation, recommend_depth
from .files import write_json
from .offline import probe_images, resolve_normalization
from .phases import Phases
from .tables import format_table
from .training import accuracy, predict, train_classifier

STRATEGIES = ("plateau", "tail", "bi", "angular", "random")
#: Chosen from the evaluation in ``benchmarks/RESULTS.md``: block influence had the highest mean healed accuracy
#: over all paired comparisons (ahead of ``tail`` by less than the noise); the plateau cut lost to both.
DEFAULT_STRATEGY = "bi"
#: Healing defaults: a short fine-tune of already trained weights.
HEAL_EPOCHS = 2
HEAL_LR = 1e-3
#: Modules after the blocks that healing always trains (those the model has).
HEAD_MODULES = ("norm", "fc_norm", "attn_pool", "head_drop", "head", "head_dist")
#: Share of an ImageFolder held out (halved into validation and test).
HELD_OUT_FRACTION = 0.2
#: Timed rounds per candidate when ``auto`` measures latency.
LATENCY_ROUNDS = 10


def _blocks(model: nn.Module) -> nn.Sequential:
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.Sequential) or len(blocks) == 0:
        raise ValueError(f"cannot truncate {type(model).__name__}: expected a timm ViT with a `blocks` Sequential")
    return blocks


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
    """A copy of a timm ViT with only the ``kept`` blocks, in that order; ``model`` is left untouched."""
    depth = len(_blocks(model))
    if not kept or sorted(set(kept)) != list(kept) or not 0 <= kept[0] <= kept[-1] < depth:
        raise ValueError(f"kept blocks must be ascending, distinct indices below {depth}, got {kept}")
    source = model.blocks
    model.blocks = nn.Sequential()  # keep the dropped blocks out of the copy
    try:
        cut = copy.deepcopy(model)
    finally:
        model.blocks = source
    cut.blocks = nn.Sequential(*(copy.deepcopy(source[i]) for i in kept))
    return cut


def trainable_modules(model: nn.Module, train_last: int) -> list[nn.Module]:
    """What healing trains: the last ``train_last`` blocks and the modules after the blocks."""
    blocks = _blocks(model)
    if not 0 <= train_last <= len(blocks):
        raise ValueError(f"train_last must be between 0 and {len(blocks)}, got {train_last}")
    heads = [m for name in HEAD_MODULES if isinstance(m := getattr(model, name, None), nn.Module)]
    return list(blocks[len(blocks) - train_last:]) + heads


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
    data: dict = field(default_factory=dict)

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
        images = fit_to_model(images, model.patch_embed.img_size, model.patch_embed.proj.in_channels)
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
    classes = getattr(model, "num_classes", 0)
    for source, y in ((heal_source, heal_y), (eval_source or data, eval_y)):
        if int(y.max()) >= classes:
            raise DataError(f"{source}: {int(y.max()) + 1} classes but the model's head has {classes} outputs")
    half = len(eval_x) // 2
    total = len(eval_x) if eval_source else len(images)
    record = {"heal": {"source": heal_source, "images": len(heal_x), "of": len(images)},
              "validation": {"source": eval_source or data, "images": half, "of": total},
              "test": {"source": eval_source or data, "images": len(eval_x) - half, "of": total}}
    return Split(heal_x, heal_y, eval_x[:half], eval_y[:half], eval_x[half:], eval_y[half:], record)


def _read_analysis(path: Path, depth: int, sha256: str) -> Analysis:
    try:
        result = Analysis.from_dict(json.loads(Path(path).read_text()))
    except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"{path}: not a readable analysis.json ({type(exc).__name__}: {exc})") from None
    if result.model.get("sha256") not in (None, sha256):
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
class TruncateResult:
    """The truncated model, the report dict (also written as JSON with ``report=``) and the written paths."""

    model: nn.Module
    report: dict
    paths: list[Path]


def truncate(
    checkpoint: str | Path,
    out: str | Path,
    *,
    analysis: str | Path | None = None,
    data: str = "mnist",
    eval_data: str | None = None,
    strategy: str | None = None,
    keep: int | None = None,
    max_drop: float = DEFAULT_MAX_DROP,
    budget: int = DEFAULT_BUDGET,
    train_last: int | None = None,
    epochs: int = HEAL_EPOCHS,
    lr: float = HEAL_LR,
    distill: bool = False,
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
) -> TruncateResult:
    """Cut ``checkpoint`` down, heal it on ``data`` and write it to ``out``.

    ``strategy="auto"`` (the default without ``keep``) searches for the cheapest healed cut whose
    validation accuracy is at most ``max_drop`` points below the uncut model's, healing at most ``budget``
    candidates (:mod:`isiwatch.cut_search`); when none qualifies the uncut weights are written. A fixed
    ``strategy`` (``bi`` by default with ``keep``) cuts to ``keep`` blocks; without ``keep``, ``plateau`` cuts
    the plateau of ``metric`` and the others cut to the recommended depth (:func:`isiwatch.depth.recommend_depth`,
    from ``analysis`` or an analysis of ``images`` healing images). ``train_last`` defaults to the late
    half of the kept blocks; ``epochs`` of healing (0: cut only). ``eval_data`` (or ``data``'s own
    ``train/``+``validation/`` layout) separates healing from evaluation images (:func:`load_split`); images are
    normalised with ``mean``/``std``, else as the checkpoint records (:func:`~isiwatch.offline.resolve_normalization`).
    The report and the output's metadata record the images, the normalisation and the weights (EMA or not)
    used. The input file is never written; outputs are written atomically, only after everything succeeded.
    """
    checkpoint, out = Path(checkpoint), Path(out)
    strategy = strategy or ("auto" if keep is None else DEFAULT_STRATEGY)
    if strategy not in ("auto", *STRATEGIES):
        raise ValueError(f"unknown strategy {strategy!r}; choose one of auto, {', '.join(STRATEGIES)}")
    if strategy == "auto" and keep is not None:
        raise ValueError("--keep fixes the depth; it cannot be combined with --strategy auto")
    check_search_options(max_drop, budget)
    if fmt not in ("pt", "safetensors"):
        raise ValueError(f"unknown format {fmt!r} (use 'pt' or 'safetensors')")
    if epochs < 0 or images < 4:
        raise ValueError(f"epochs must be at least 0 and images at least 4, got {epochs} and {images}")
    _check_paths({"checkpoint": checkpoint, "--analysis": analysis}, {"--out": out, "--report": report})
    ckpt = load_checkpoint(checkpoint, arch=arch, num_heads=num_heads, prefer_ema=prefer_ema)
    uncut = ckpt.build().to(device).eval()
    depth = len(_blocks(uncut))
    if keep is not None and not 1 <= keep < depth:
        raise ValueError(f"--keep must be between 1 and {depth - 1} for this {depth}-block model, got {keep}")
    source_analysis = _read_analysis(Path(analysis), depth, ckpt.sha256) if analysis is not None else None
    norm = resolve_normalization(uncut, data, ckpt.data_config, mean, std)
    split = load_split(uncut, data, eval_data, norm)
    metric = metric or (source_analysis.phase_metric if source_analysis else DEFAULT_PHASE_METRIC)
    if source_analysis is None and (keep is None or strategy == "plateau"):
        source_analysis = analyze(uncut, split.train_x[:images], split.train_y[:images], phase_metric=metric)
    phases = _phases(source_analysis, metric) if source_analysis is not None else None
    recommendation = recommend_depth(source_analysis, max_drop / 100) if source_analysis is not None else None
    distances = (boundary_distances(uncut, split.train_x[:images]) if strategy in ("auto", "bi", "angular") else None)
    heal_options = {"epochs": epochs, "lr": lr, "teacher": uncut if distill else None, "seed": seed,
                    "amp": device.startswith("cuda"), "train_last": train_last}

    if strategy == "auto":
        model, kept, search = auto_cut(uncut, split, recommendation, phases, distances, max_drop, budget, seed,
                                        heal_options, progress)
        steps = search["winner"]["healing_steps"] if search["winner"] else 0
        eval_x, eval_y = split.test_x, split.test_y
    else:
        if strategy == "plateau" and phases is None:
            raise ValueError(f"no plateau in the {metric} curve of {checkpoint}; "
                             "pass --keep K or use --strategy auto, tail, bi, angular or random")
        if keep is None:
            keep = plateau_keep(phases, depth) if strategy == "plateau" else recommendation.depth
            if keep >= depth:
                raise ValueError(f"the analysis recommends keeping all {depth} blocks ({recommendation.signal}); "
                                 "pass --keep K to cut anyway, or use --strategy auto")
        kept = choose_blocks(strategy, depth, keep, phases=phases, distances=distances, seed=seed)
        model = cut_vit(uncut, kept)
        steps = heal(model, split.train_x, split.train_y, progress=progress, **heal_options)
        search = None
        eval_x, eval_y = split.held_out
    keep, train_last = len(kept), default_train_last(len(kept)) if train_last is None else train_last
    reference, after = predict(uncut, eval_x), predict(model, eval_x)
    before = predict(cut_vit(uncut, kept), eval_x) if keep < depth else reference

    model_kwargs = {**ckpt.model_kwargs, "depth": keep}
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    timm.create_model(ckpt.arch, pretrained=False, **model_kwargs).load_state_dict(state, strict=True)
    result = _report(ckpt, uncut, model, eval_x, eval_y, reference, before, after)
    result.update({"strategy": strategy if search is None else f"auto: {search['winner_strategy']}",
                   "metric": metric, "phases": phases.to_dict() if phases else None,
                   "recommendation": recommendation.to_dict() if recommendation else None,
                   "kept_blocks": kept, "dropped_blocks": sorted(set(range(depth)) - set(kept)),
                   "train_last": train_last, "epochs": epochs, "healing_steps": steps,
                   "lr": lr, "distill": distill, "data": split.data, "weights": ckpt.weights,
                   "normalization": norm.to_dict(), "device": device, "seed": seed, "output": str(out),
                   "evaluated_on": "test" if search else "validation+test", "search": search})
    metadata = {"kept_blocks": kept, "source_sha256": ckpt.sha256, "source_checkpoint": str(ckpt.path),
                "source_depth": depth, **{k: result[k] for k in ("strategy", "metric", "phases", "train_last",
                                                                   "epochs", "distill", "accuracy", "weights",
                                                                   "normalization", "data")}}
    paths = [save_checkpoint(out, ckpt.arch, model_kwargs, state, metadata, fmt=fmt)]
    if report is not None:
        paths.append(write_json(report, result))
    return TruncateResult(model, result, paths)


def auto_cut(uncut: nn.Module, split: Split, recommendation: DepthRecommendation, phases: Phases | None,
             distances: BoundaryDistances, max_drop: float, budget: int, seed: int, heal_options: dict,
             progress: bool = False) -> tuple[nn.Module, list[int], dict]:
    """The cheapest qualifying healed cut of ``uncut`` (or a copy of it), its kept blocks and the search record.

    ``heal_options``: keyword arguments of :func:`heal`.
    """
    depth = len(uncut.blocks)
    reference = accuracy(uncut, split.val_x, split.val_y)

    def blocks_for(strategy: str, keep: int) -> list[int] | None:
        if strategy == "plateau" and phases is None:
            return None
        return choose_blocks(strategy, depth, keep, phases=phases, distances=distances, seed=seed)

    def heal_and_score(strategy: str, kept: list[int]):
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
    return search.best_model, winner.kept, record


def _report(ckpt, uncut: nn.Module, model: nn.Module, images: Tensor, labels: Tensor, reference: Tensor,
            before: Tensor, after: Tensor) -> dict:
    """Costs (parameters, FLOPs per image, median latency of a batch) and held-out accuracies."""
    batch = images[:64].to(next(uncut.parameters()).device)
    latency = measure_latency({"uncut": uncut, "truncated": model}, batch)
    cost = {name: {"blocks": len(m.blocks), "parameters": count_parameters(m),
                   "flops_per_image": forward_flops(m, batch[:1]), "latency_ms": latency[name]}
            for name, m in (("uncut", uncut), ("truncated", model))}
    return {"source": {"checkpoint": str(ckpt.path), "sha256": ckpt.sha256, "arch": ckpt.arch},
            "held_out_images": len(labels), "latency_batch": len(batch), "cost": cost,
            "accuracy": {name: float((p == labels).float().mean())
                         for name, p in (("uncut", reference), ("cut", before), ("healed", after))},
            "agreement": {name: float((p == reference).float().mean()) for name, p in (("cut", before),
                                                                                     ("healed", after))}}


def report_rows(report: dict) -> tuple[list[str], list[list]]:
    """Before/after header and rows: blocks, parameters, FLOPs, latency, held-out accuracy, agreement."""
    cost, acc, agree = report["cost"], report["accuracy"], report["agreement"]
    header = ["model", "blocks", "params", "MFLOPs/img", f"latency ms/{report['latency_batch']}", "accuracy",
              "agreement"]
    rows = []
    for name, kind in (("uncut", "uncut"), ("cut", "truncated"), ("healed", "truncated")):
        c = cost[kind]
        rows.append([name, c["blocks"], c["parameters"], c["flops_per_image"] / 1e6, c["latency_ms"], acc[name],
                     agree.get(name, 1.0)])
    return header, rows


def candidates_table(report: dict) -> str:
    """Every cut ``auto`` tried, with validation accuracies, costs and the winner marked."""
    search = report["search"]
    header = ["strategy", "blocks", "kept", "val cut", "val healed", "params", "MFLOPs/img",
              f"latency ms/{search['latency_batch']}", ""]
    rows = [[c["strategy"], c["keep"], ",".join(map(str, c["kept_blocks"])), c["validation_accuracy"]["cut"],
             c["validation_accuracy"]["healed"], c["parameters"], c["flops_per_image"] / 1e6, c["latency_ms"],
             "winner" if c["winner"] else ("ok" if c["qualifies"] else "")] for c in search["candidates"]]
    points = f"{search['max_drop']:g} point{'' if search['max_drop'] == 1 else 's'}"
    return (f"uncut validation accuracy {search['uncut_validation_accuracy']:.3f}; a cut qualifies within "
            f"{points}\n{format_table(header, rows)}")


def report_table(report: dict) -> str:
    """The before/after table as text, with the kept blocks and the strategy."""
    kept = ", ".join(map(str, report["kept_blocks"]))
    return f"{format_table(*report_rows(report))}\nkept blocks {kept} ({report['strategy']})"
