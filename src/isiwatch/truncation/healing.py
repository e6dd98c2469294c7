"""A small, seeded training loop for ViT classifiers: the demo's trainer and truncate's healer."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import timm
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from .classifier_layout import logits

#: The demo's ViT on 28×28 digits: patch 7 → 16 patch tokens + [CLS].
DIGITS_VIT_KWARGS = {"img_size": 28, "patch_size": 7, "in_chans": 1, "num_classes": 10, "embed_dim": 64,
                     "depth": 12, "num_heads": 4, "mlp_ratio": 4.0}
DIGITS_VIT_ARCH = "vit_tiny_patch16_224"


def make_digits_vit(seed: int = 0, **overrides: Any) -> tuple[nn.Module, dict[str, Any]]:
    """A freshly initialised timm ViT for the embedded digits and the kwargs that rebuild it."""
    kwargs = {**DIGITS_VIT_KWARGS, **overrides}
    torch.manual_seed(seed)
    return timm.create_model(DIGITS_VIT_ARCH, pretrained=False, **kwargs), kwargs


@torch.no_grad()
def predict(model: nn.Module, images: Tensor, batch_size: int = 500) -> Tensor:
    """Class predictions in eval mode (the model's mode is restored)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out = torch.cat([logits(model(images[i:i + batch_size].to(device))).argmax(-1).cpu()
                     for i in range(0, len(images), batch_size)])
    model.train(was_training)
    return out


def accuracy(model: nn.Module, images: Tensor, labels: Tensor) -> float:
    return float((predict(model, images) == labels).float().mean())


def train_classifier(
    model: nn.Module,
    images: Tensor,
    labels: Tensor,
    *,
    epochs: int,
    batch_size: int = 128,
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
) -> int:
    """AdamW over ``epochs`` with a one-cycle or cosine learning-rate schedule; returns the optimizer steps.

    ``params`` restricts training to a subset (the rest should be frozen by the caller); with ``teacher``
    the loss adds KL distillation to its logits. ``schedule="cosine"`` decays ``lr`` to 0 without warm-up
    (for fine-tuning already trained weights). ``amp`` runs forward passes in bfloat16 autocast when the
    model is on a CUDA device (ignored on CPU). ``max_steps`` ends training after that many optimizer
    steps, with the schedule spanning them. ``on_step(step, loss)`` runs after every optimizer step and may
    return True to stop training.
    """
    device = next(model.parameters()).device
    params = [p for p in (params if params is not None else model.parameters()) if p.requires_grad]
    steps_per_epoch = (len(images) + batch_size - 1) // batch_size
    total = epochs * steps_per_epoch if max_steps is None else min(epochs * steps_per_epoch, max_steps)
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    scheduler: torch.optim.lr_scheduler.LRScheduler
    if schedule == "onecycle":
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=max(total, 1))
    elif schedule == "cosine":
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(total, 1))
    else:
        raise ValueError(f"unknown schedule {schedule!r} (use 'onecycle' or 'cosine')")
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp and device.type == "cuda")
    order_gen = torch.Generator().manual_seed(seed)
    step = 0
    bar = tqdm(total=total, desc=desc, disable=not progress, leave=False)
    try:
        for _ in range(epochs):
            order = torch.randperm(len(images), generator=order_gen)
            for i in range(0, len(images), batch_size):
                idx = order[i:i + batch_size]
                x, y = images[idx].to(device), labels[idx].to(device)
                with autocast:
                    out = logits(model(x)).float()
                    loss = F.cross_entropy(out, y)
                    if teacher is not None:
                        with torch.no_grad():
                            target = logits(teacher(x)).float().log_softmax(-1)
                        loss = loss + F.kl_div(out.log_softmax(-1), target, log_target=True,
                                               reduction="batchmean")
                optimizer.zero_grad(set_to_none=True)
                loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward untyped
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
    return step
