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
from dataclasses import dataclass
from pathlib import Path

import timm
import torch
from torch import Tensor, nn

from .analysis import DEFAULT_PHASE_METRIC, Analysis, analyze
from .block_scores import BoundaryDistances, angular_distance, block_influence, boundary_distances
from .checkpoint import load_checkpoint, save_checkpoint
from .cost import count_parameters, forward_flops, measure_latency
from .data import DIGITS_TRAIN, DataError, embedded_digits, fit_to_model
from .files import write_json
from .offline import probe_images
from .phases import Phases
from .tables import format_table
from .training import predict, train_classifier

STRATEGIES = ("plateau", "tail", "bi", "angular", "random")
#: Chosen from the evaluation in ``benchmarks/RESULTS.md``: block influence had the highest mean healed accuracy
#: over all paired comparisons (ahead of ``tail`` by less than the noise); the plateau cut lost to both.
DEFAULT_STRATEGY = "bi"
#: Healing defaults: a short fine-tune of already trained weights.
HEAL_EPOCHS = 2
HEAL_LR = 1e-3
#: Modules after the blocks that healing always trains (those the model has).
HEAD_MODULES = ("norm", "fc_norm", "attn_pool", "head_drop", "head", "head_dist")
#: Share of an ImageFolder held out for the before/after accuracy.
HELD_OUT_FRACTION = 0.2


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


def heal(model: nn.Module, images: Tensor, labels: Tensor, *, train_last: int, epochs: int = HEAL_EPOCHS,
         lr: float = HEAL_LR, teacher: nn.Module | None = None, seed: int = 0, progress: bool = False,
         amp: bool = False) -> int:
    """Fine-tune the late blocks, final norm and head of a cut ViT in place; returns optimizer steps.

    Everything else is frozen and kept in eval mode (no dropout, drop-path or norm updates there). With
    ``teacher`` the loss adds KL distillation to its logits. ``amp``: bfloat16 autocast on CUDA. The model
    is left in eval mode with every parameter trainable again.
    """
    params = prepare_healing(model, train_last)
    if teacher is not None:
        teacher.eval()
    try:
        return train_classifier(model, images, labels, epochs=epochs, lr=lr, params=params, teacher=teacher,
                                seed=seed, progress=progress, desc="heal", schedule="cosine", amp=amp)
    finally:
        model.requires_grad_(True).eval()


@dataclass
class Split:
    """Healing images and the held-out images the report's accuracies are measured on."""

    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor


def load_split(model: nn.Module, data: str) -> Split:
    """'mnist': the embedded digits (the demo's 4,000 training / 1,000 held-out split); otherwise an
    ImageFolder, of which a fixed HELD_OUT_FRACTION is held out."""
    if data == "mnist":
        images, labels = embedded_digits()
        images = fit_to_model(images, model.patch_embed.img_size, model.patch_embed.proj.in_channels)
        cut = DIGITS_TRAIN
    else:
        images, labels = probe_images(model, data, None)
        if len(images) < 2:
            raise DataError(f"{data}: need at least 2 images to heal and evaluate, found {len(images)}")
        cut = len(images) - max(1, round(HELD_OUT_FRACTION * len(images)))
    classes = getattr(model, "num_classes", 0)
    if int(labels.max()) >= classes:
        raise DataError(f"{data}: {int(labels.max()) + 1} classes but the model's head has {classes} outputs")
    return Split(images[:cut], labels[:cut], images[cut:], labels[cut:])


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
    strategy: str = DEFAULT_STRATEGY,
    keep: int | None = None,
    train_last: int | None = None,
    epochs: int = HEAL_EPOCHS,
    lr: float = HEAL_LR,
    distill: bool = False,
    metric: str | None = None,
    images: int = 1000,
    fmt: str = "pt",
    report: str | Path | None = None,
    arch: str | None = None,
    prefer_ema: bool = True,
    device: str = "cpu",
    seed: int = 0,
    progress: bool = False,
) -> TruncateResult:
    """Cut ``checkpoint`` with ``strategy`` to ``keep`` blocks, heal it on ``data`` and write it to ``out``.

    Without ``keep`` the plateau of ``metric`` (from ``analysis`` or an analysis of ``images`` healing
    images) sets the depth. ``train_last`` defaults to the late half of the kept blocks; ``epochs`` of
    healing (0: cut only). The input file is never written; outputs are written atomically, only after
    everything succeeded.
    """
    checkpoint, out = Path(checkpoint), Path(out)
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if fmt not in ("pt", "safetensors"):
        raise ValueError(f"unknown format {fmt!r} (use 'pt' or 'safetensors')")
    if epochs < 0 or images < 4:
        raise ValueError(f"epochs must be at least 0 and images at least 4, got {epochs} and {images}")
    if out.resolve() == checkpoint.resolve() or (report is not None and Path(report).resolve() == checkpoint.resolve()):
        raise ValueError(f"{out}: refusing to overwrite the input checkpoint; choose another --out")
    ckpt = load_checkpoint(checkpoint, arch=arch, prefer_ema=prefer_ema)
    uncut = ckpt.build().to(device).eval()
    depth = len(_blocks(uncut))
    if keep is not None and not 1 <= keep < depth:
        raise ValueError(f"--keep must be between 1 and {depth - 1} for this {depth}-block model, got {keep}")
    source_analysis = _read_analysis(Path(analysis), depth, ckpt.sha256) if analysis is not None else None
    split = load_split(uncut, data)
    metric = metric or (source_analysis.phase_metric if source_analysis else DEFAULT_PHASE_METRIC)

    phases = None
    if strategy == "plateau" or keep is None:
        if source_analysis is None:
            source_analysis = analyze(uncut, split.train_x[:images], split.train_y[:images], phase_metric=metric)
        phases = _phases(source_analysis, metric)
        if phases is None:
            raise ValueError(f"no plateau in the {metric} curve of {checkpoint}; "
                             "pass --keep K with --strategy tail, bi, angular or random")
        keep = keep or plateau_keep(phases, depth)
    distances = (boundary_distances(uncut, split.train_x[:images]) if strategy in ("bi", "angular") else None)
    kept = choose_blocks(strategy, depth, keep, phases=phases, distances=distances, seed=seed)
    train_last = default_train_last(keep) if train_last is None else train_last

    reference = predict(uncut, split.test_x)
    model = cut_vit(uncut, kept)
    before = predict(model, split.test_x)
    steps = heal(model, split.train_x, split.train_y, train_last=train_last, epochs=epochs, lr=lr,
                 teacher=uncut if distill else None, seed=seed, progress=progress, amp=device.startswith("cuda"))
    after = predict(model, split.test_x)

    model_kwargs = {**ckpt.model_kwargs, "depth": keep}
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    timm.create_model(ckpt.arch, pretrained=False, **model_kwargs).load_state_dict(state, strict=True)
    result = _report(ckpt, uncut, model, split, reference, before, after)
    result.update({"strategy": strategy, "metric": metric, "phases": phases.to_dict() if phases else None,
                   "kept_blocks": kept, "dropped_blocks": sorted(set(range(depth)) - set(kept)),
                   "train_last": train_last, "epochs": epochs, "healing_steps": steps, "lr": lr,
                   "distill": distill, "data": data, "device": device, "seed": seed, "output": str(out)})
    metadata = {"kept_blocks": kept, "source_sha256": ckpt.sha256, "source_checkpoint": str(ckpt.path),
                "source_depth": depth, **{k: result[k] for k in ("strategy", "metric", "phases", "train_last",
                                                                   "epochs", "distill", "accuracy")}}
    paths = [save_checkpoint(out, ckpt.arch, model_kwargs, state, metadata, fmt=fmt)]
    if report is not None:
        paths.append(write_json(report, result))
    return TruncateResult(model, result, paths)


def _report(ckpt, uncut: nn.Module, model: nn.Module, split: Split, reference: Tensor, before: Tensor,
            after: Tensor) -> dict:
    """Costs (parameters, FLOPs per image, median latency of a batch) and held-out accuracies."""
    batch = split.test_x[:64].to(next(uncut.parameters()).device)
    latency = measure_latency({"uncut": uncut, "truncated": model}, batch)
    cost = {name: {"blocks": len(m.blocks), "parameters": count_parameters(m),
                   "flops_per_image": forward_flops(m, batch[:1]), "latency_ms": latency[name]}
            for name, m in (("uncut", uncut), ("truncated", model))}
    y = split.test_y
    return {"source": {"checkpoint": str(ckpt.path), "sha256": ckpt.sha256, "arch": ckpt.arch},
            "held_out_images": len(y), "latency_batch": len(batch), "cost": cost,
            "accuracy": {name: float((p == y).float().mean())
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


def report_table(report: dict) -> str:
    """The before/after table as text, with the kept blocks and the strategy."""
    kept = ", ".join(map(str, report["kept_blocks"]))
    return f"{format_table(*report_rows(report))}\nkept blocks {kept} ({report['strategy']})"
