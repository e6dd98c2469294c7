"""A small, seeded training loop for ViT classifiers (the demo's trainer) and healing: fine-tuning the late blocks
of a cut ViT with the early ones frozen."""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import timm
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from tqdm.auto import tqdm

from ..io.timm_data import batches
from .classifier_layout import block_list, logits, modules_after_blocks
from .engine import ShardedLoader
from .strategies import HEAL_EPOCHS, HEAL_LR

if TYPE_CHECKING:
    from lightning_fabric import Fabric

__all__ = ["accuracy", "default_train_last", "heal", "Images", "make_digits_vit", "predict", "prepare_healing",
           "train_classifier", "trainable_modules"]

#: The demo's ViT on 28×28 digits: patch 7 → 16 patch tokens + [CLS].
DIGITS_VIT_KWARGS = {"img_size": 28, "patch_size": 7, "in_chans": 1, "num_classes": 10, "embed_dim": 64,
                     "depth": 12, "num_heads": 4, "mlp_ratio": 4.0}
DIGITS_VIT_ARCH = "vit_tiny_patch16_224"
#: Images per optimizer step when healing (or training) on tensors; a DataLoader keeps its own batch size.
HEAL_BATCH = 128


def make_digits_vit(seed: int = 0, **overrides: Any) -> tuple[nn.Module, dict[str, Any]]:
    """A freshly initialised timm ViT for the embedded digits and the kwargs that rebuild it."""
    kwargs = {**DIGITS_VIT_KWARGS, **overrides}
    torch.manual_seed(seed)
    return timm.create_model(DIGITS_VIT_ARCH, pretrained=False, **kwargs), kwargs


#: What predictions and healing read: model-ready images (a tensor), a DataLoader of ``(images, labels)`` batches or
#: one set up by Fabric (`ShardedLoader`).
Images = Tensor | DataLoader[Any] | ShardedLoader


@torch.no_grad()
def predict(model: nn.Module, images: Images, batch_size: int = 500) -> Tensor:
    """Class predictions in eval mode (the model's mode is restored), in the images' order: every process's shard
    gathered for a `ShardedLoader`."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    if isinstance(images, Tensor):
        chunks: Iterable[Any] = (images[i:i + batch_size] for i in range(0, len(images), batch_size))
    else:
        chunks = (x for x, _ in batches(images))
    autocast = images.fabric.autocast() if isinstance(images, ShardedLoader) else contextlib.nullcontext()
    with autocast:
        out = [logits(model(x.to(device))).argmax(-1).cpu() for x in chunks]
    model.train(was_training)
    predictions = torch.cat(out) if out else torch.zeros(0, dtype=torch.long)
    return images.gather(predictions) if isinstance(images, ShardedLoader) else predictions


def accuracy(model: nn.Module, images: Images, labels: Tensor) -> float:
    """Share of ``labels`` predicted (`predict`)."""
    return float((predict(model, images) == labels).float().mean())


def _batches(images: Tensor | Iterable[Any], labels: Tensor | None, batch_size: int,
             order: torch.Generator) -> Iterator[tuple[Tensor, Tensor]]:
    """One epoch of (images, labels) batches: a loader's own, or tensors in a seeded order."""
    if not isinstance(images, Tensor):
        yield from batches(images)
        return
    assert labels is not None  # train_classifier checked
    permutation = torch.randperm(len(images), generator=order)
    for i in range(0, len(images), batch_size):
        idx = permutation[i:i + batch_size]
        yield images[idx], labels[idx]


def _restart_order(images: Images, seed: int) -> None:
    """Restart a shuffling loader's order at ``seed``, so a heal's batches are the same whichever heals read the
    loader before it (a resumed search heals each candidate as an uninterrupted one did)."""
    if isinstance(images, Tensor):
        return
    loader = images.loader if isinstance(images, ShardedLoader) else images
    sampler = getattr(loader, "sampler", None)
    if isinstance(sampler, DistributedSampler):
        sampler.seed = seed
        if hasattr(loader, "_num_iter_calls"):  # Fabric's loader sets the sampler's epoch from its passes so far
            loader._num_iter_calls = 0
    generator = getattr(sampler, "generator", None)
    if isinstance(generator, torch.Generator):
        generator.manual_seed(seed)


def train_classifier(
    model: nn.Module,
    images: Images,
    labels: Tensor | None = None,
    *,
    epochs: int,
    batch_size: int = HEAL_BATCH,
    lr: float = 2e-3,
    weight_decay: float = 0.05,
    params: Iterable[nn.Parameter] | None = None,
    teacher: nn.Module | None = None,
    seed: int = 0,
    on_step: Callable[[int, float], bool | None] | None = None,
    progress: bool = False,
    desc: str = "train",
    schedule: str = "onecycle",
    amp: bool = False,
    max_steps: int | None = None,
    fabric: Fabric | None = None,
    head_lr: float | None = None,
) -> int:
    """AdamW over ``epochs`` of ``images`` and ``labels`` (or the ``(images, labels)`` batches of a DataLoader,
    in its own batch size and order) with a one-cycle or cosine learning-rate schedule; returns the optimizer steps.

    ``params`` restricts training to a subset (the rest should be frozen by the caller); with ``teacher``
    the loss adds KL distillation to its logits. ``schedule="cosine"`` decays ``lr`` to 0 without warm-up
    (for fine-tuning already trained weights). ``amp`` runs forward passes in bfloat16 autocast when the
    model is on a CUDA device (ignored on CPU). ``max_steps`` ends training after that many optimizer
    steps, with the schedule spanning them. ``head_lr``: the classifier head's own peak rate (a fresh head on
    pretrained blocks learns from scratch while the blocks move gently); None: ``lr`` for every parameter.
    ``on_step(step, loss)`` runs after every optimizer step and may
    return True to stop training.

    With ``fabric`` (or a `ShardedLoader`, which carries its Fabric) the model
    trains under Fabric's strategy and precision, each process on its shard of the batches (``amp`` is then
    Fabric's ``precision``); ``model`` ends with the trained weights on every process.
    """
    if labels is None and isinstance(images, Tensor):
        raise ValueError("labels are needed with an images tensor (or pass a DataLoader of (images, labels))")
    if isinstance(images, ShardedLoader):
        fabric = images.fabric
    elif fabric is not None:
        if isinstance(images, Tensor):
            assert labels is not None  # checked above
            images = DataLoader(TensorDataset(images, labels), batch_size=batch_size, shuffle=True,
                                generator=torch.Generator().manual_seed(seed))
        images = ShardedLoader(fabric, images)
    chosen = [p for p in (params if params is not None else model.parameters()) if p.requires_grad]
    steps_per_epoch = len(images) if not isinstance(images, Tensor) else (len(images) + batch_size - 1) // batch_size
    total = epochs * steps_per_epoch if max_steps is None else min(epochs * steps_per_epoch, max_steps)
    work, run = model, model
    autocast: contextlib.AbstractContextManager[Any]
    groups = _rate_groups(model, chosen, lr, head_lr)
    if fabric is None:
        optimizer = torch.optim.AdamW(groups, weight_decay=weight_decay)
        device = next(model.parameters()).device
        autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp and device.type == "cuda")
        backward: Callable[[Tensor], None] = Tensor.backward
    else:  # a copy trains (Fabric may shard its parameters); its full weights are loaded into model at the end
        names = {id(p): name for name, p in model.named_parameters()}
        work = copy.deepcopy(model)
        by_name = dict(work.named_parameters())
        optimizer = torch.optim.AdamW([{"params": [by_name[names[id(p)]] for p in group["params"]],
                                        "lr": group["lr"]} for group in groups], weight_decay=weight_decay)
        run, optimizer = fabric.setup(work, optimizer)
        device, autocast, backward = fabric.device, fabric.autocast(), fabric.backward
        if teacher is not None:
            teacher.to(device)
    scheduler: torch.optim.lr_scheduler.LRScheduler
    if schedule == "onecycle":
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=[group["lr"] for group in groups],
                                                        total_steps=max(total, 1))
    elif schedule == "cosine":
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(total, 1))
    else:
        raise ValueError(f"unknown schedule {schedule!r} (use 'onecycle' or 'cosine')")
    order_gen = torch.Generator().manual_seed(seed)
    _restart_order(images, seed)
    step = 0
    quiet = not progress or total == 0 or (fabric is not None and not fabric.is_global_zero)
    bar = tqdm(total=total, desc=desc, disable=quiet, leave=False)
    try:
        for _ in range(epochs):
            for x, y in _batches(images, labels, batch_size, order_gen):
                x, y = x.to(device), y.to(device)
                with autocast:
                    out = logits(run(x)).float()
                    loss = F.cross_entropy(out, y)
                    if teacher is not None:
                        with torch.no_grad():
                            target = logits(teacher(x)).float().log_softmax(-1)
                        loss = loss + F.kl_div(out.log_softmax(-1), target, log_target=True,
                                               reduction="batchmean")
                optimizer.zero_grad(set_to_none=True)
                backward(loss)
                optimizer.step()
                scheduler.step()
                step += 1
                bar.update(1)
                value = loss.item()
                bar.set_postfix(loss=f"{value:.3f}")
                if (on_step is not None and on_step(step, value)) or step == total:
                    return step
    finally:
        bar.close()
        if fabric is not None:
            model.load_state_dict(_full_state(fabric, run, work))
    return step


def _rate_groups(model: nn.Module, chosen: list[nn.Parameter], lr: float,
                 head_lr: float | None) -> list[dict[str, Any]]:
    """AdamW's parameter groups: ``chosen`` at ``lr``, or its classifier-head parameters (timm's
    ``get_classifier()``) at ``head_lr`` and the rest at ``lr``."""
    if head_lr is None:
        return [{"params": chosen, "lr": lr}]
    head = {id(p) for p in model.get_classifier().parameters()}  # type: ignore[operator]
    return [{"params": [p for p in chosen if id(p) not in head], "lr": lr},
            {"params": [p for p in chosen if id(p) in head], "lr": head_lr}]


def _full_state(fabric: Fabric, run: nn.Module, work: nn.Module) -> dict[str, Tensor]:
    """The whole trained weights of ``work`` on every process: gathered from the shards under FSDP."""
    if type(fabric.strategy).__name__ == "FSDPStrategy":
        from torch.distributed.fsdp import FullyShardedDataParallel

        wrapped = getattr(run, "_forward_module", run)
        with FullyShardedDataParallel.summon_full_params(wrapped, writeback=False):
            return {k: v.detach().clone() for k, v in work.state_dict().items()}
    return work.state_dict()


def trainable_modules(model: nn.Module, train_last: int) -> list[nn.Module]:
    """What healing trains: the last ``train_last`` blocks and the modules after the blocks."""
    blocks = block_list(model)
    if not 0 <= train_last <= len(blocks):
        raise ValueError(f"train_last must be between 0 and {len(blocks)}, got {train_last}")
    return list(blocks[len(blocks) - train_last:]) + modules_after_blocks(model)


def prepare_healing(model: nn.Module, train_last: int) -> list[nn.Parameter]:
    """The freeze-early/heal-late step of healing, for healing inside your own training loop (Lightning, a
    Hugging Face Trainer, timm's ``train.py``): freeze ``model`` into eval mode except what healing trains, the
    last ``train_last`` blocks and the modules after them (`trainable_modules`), which are put in train
    mode; returns the parameters to give your optimizer. [`heal`][isiwatch.heal] is this step plus its own loop."""
    trainable = trainable_modules(model, train_last)
    model.requires_grad_(False).eval()
    for module in trainable:
        module.requires_grad_(True).train()
    return [p for module in trainable for p in module.parameters()]


def default_train_last(keep: int) -> int:
    """The late half of the kept blocks (rounded up): the same healing budget for every strategy."""
    return math.ceil(keep / 2)


def heal(model: nn.Module, data: Images, labels: Tensor | None = None, *,
         train_last: int | None = None, epochs: int = HEAL_EPOCHS, max_steps: int | None = None, lr: float = HEAL_LR,
         batch_size: int = HEAL_BATCH, teacher: nn.Module | None = None, seed: int = 0, progress: bool = False,
         amp: bool = False, fabric: Fabric | None = None) -> int:
    """Fine-tune the late blocks of a cut ViT in place with the early ones frozen: the blocks nearest the cut
    adapt to the input they now receive, while the early blocks keep the features the model learnt.

    The last ``train_last`` blocks, the final norm and the head train with AdamW under a cosine schedule;
    everything else is frozen and kept in eval mode (no dropout, drop-path or norm updates there). The model is
    left in eval mode with every parameter trainable again.

    Args:
        model: The cut ViT classifier (e.g. from [`cut`][isiwatch.cut]), changed in place.
        data: A DataLoader of ``(images, labels)`` batches (its own batch size and order; with ``fabric`` it gets
            a ``DistributedSampler``), or an images tensor with ``labels``; images model-ready (sized and
            normalised).
        labels: Class labels of an images tensor ``data``; None with a DataLoader.
        train_last: How many of the last blocks to train (default: `default_train_last`, the late half).
        epochs: Passes over ``data``.
        max_steps: Stop after this many optimizer steps (the schedule spans them); None: all of ``epochs``.
        lr: Peak learning rate.
        batch_size: Batch size for tensor ``data``.
        teacher: The uncut model, to add KL distillation to its logits; None: labels only.
        seed: Seed of the tensor batches' order.
        progress: Show a progress bar.
        amp: bfloat16 autocast on a CUDA device.
        fabric: A launched Lightning Fabric to heal under (its devices, strategy and precision; each process
            reads its shard of ``data`` and ``model`` ends with the same healed weights on every process); None:
            in this process on the model's device.

    Returns:
        The optimizer steps taken.
    """
    params = prepare_healing(model, default_train_last(len(block_list(model))) if train_last is None else train_last)
    if teacher is not None:
        teacher.eval()
    try:
        return train_classifier(model, data, labels, epochs=epochs, lr=lr, batch_size=batch_size, params=params,
                                teacher=teacher, seed=seed, progress=progress, desc="heal", schedule="cosine",
                                amp=amp, max_steps=max_steps, fabric=fabric)
    finally:
        model.requires_grad_(True).eval()
