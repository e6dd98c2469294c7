"""The two tasks of the depth benchmark, built deterministically from the embedded MNIST digits.

- ``digits``: the demo's split, 4,000 training / 1,000 held-out digits, 28×28, label = the digit.
- ``max_pair``: two digits side by side (28×56, patch 14: 8 tokens), label = the larger of the two.
  Training pairs are drawn only from the 4,000 training digits and held-out pairs only from the 1,000
  held-out digits, so no held-out image shares a digit image with training.

The held-out set is split in two halves by digit (first 500 / last 500 held-out digits): ``val`` (for
choosing among truncation candidates) and ``test`` (for reporting); the sweep reports on both together.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from isiwatch.io.data import DIGITS_TRAIN, embedded_digits

TASKS = ("digits", "max_pair")
PAIRS_TRAIN, PAIRS_HELD_OUT = 8000, 2000


@dataclass
class Task:
    """Healing, validation and test tensors in the shape truncate's search reads a split (``auto_cut`` takes it as
    its plan's split), the task's name and the timm ViT kwargs (besides depth and width) its images need."""

    train_x: Tensor
    train_y: Tensor
    val_x: Tensor
    val_y: Tensor
    test_x: Tensor
    test_y: Tensor
    name: str = ""
    model_kwargs: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)

    @property
    def held_out(self) -> tuple[Tensor, Tensor]:
        return torch.cat([self.val_x, self.test_x]), torch.cat([self.val_y, self.test_y])

    @property
    def probe_x(self) -> list[tuple[Tensor, Tensor]]:
        """The healing images as one batch, as a split's ``probe_x`` gives them (the search judges its repairs on
        the first of them)."""
        return [(self.train_x, self.train_y)]


def _pairs(images: Tensor, labels: Tensor, count: int, seed: int) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    a = torch.randint(len(images), (count,), generator=gen)
    b = torch.randint(len(images), (count,), generator=gen)
    return torch.cat([images[a], images[b]], dim=-1), torch.maximum(labels[a], labels[b])


def load_task(name: str) -> Task:
    images, labels = embedded_digits()
    train = images[:DIGITS_TRAIN], labels[:DIGITS_TRAIN]
    half = DIGITS_TRAIN + (len(images) - DIGITS_TRAIN) // 2
    val, test = (images[DIGITS_TRAIN:half], labels[DIGITS_TRAIN:half]), (images[half:], labels[half:])
    if name == "digits":
        return Task(*train, *val, *test, name=name, model_kwargs={"img_size": 28, "patch_size": 7})
    if name == "max_pair":
        return Task(*_pairs(*train, PAIRS_TRAIN, 1), *_pairs(*val, PAIRS_HELD_OUT // 2, 2),
                    *_pairs(*test, PAIRS_HELD_OUT // 2, 3), name=name,
                    model_kwargs={"img_size": (28, 56), "patch_size": 14})
    raise ValueError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
