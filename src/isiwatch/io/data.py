"""The embedded MNIST digits (5,000 real digits shipped with isiwatch, ``io/digits/``) as tensors, and the errors of
image options and image reading (`isiwatch.io.timm_data` streams images for a model)."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from importlib.resources import files

import torch
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


#: The embedded digits: 5,000 MNIST digits (CC BY-SA 3.0; source and licence in ``digits/README.md`` beside it).
DIGITS_FILE = "digits/mnist_5000.npz"


@functools.cache
def digit_pixels() -> tuple[Tensor, Tensor]:
    """The embedded digits as stored: uint8 pixels (5000×28×28) and int64 labels, sorted by class; read once per
    process (about 0.05 s)."""
    import numpy as np

    with (files("isiwatch.io") / DIGITS_FILE).open("rb") as fh, np.load(fh) as stored:
        pixels, labels = stored["pixels"], stored["labels"]
    return torch.from_numpy(pixels.copy()), torch.from_numpy(labels.astype(np.int64))


def embedded_digits(seed: int = 0) -> tuple[Tensor, Tensor]:
    """All 5,000 embedded digits as normalised (5000,1,28,28) floats and int64 labels, in a fixed shuffle
    (the file stores them sorted by class)."""
    pixels, labels = digit_pixels()
    images = pixels.float().unsqueeze(1) / 255.0
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(seed))
    images = (images[order] - MNIST_MEAN) / MNIST_STD
    return images, labels[order]
