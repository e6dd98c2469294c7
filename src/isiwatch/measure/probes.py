"""Linear probes: held-out accuracy of softmax classifiers on per-layer features, all layers solved together."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .ridge import DEFAULT_ALPHAS, accuracy_score, correct_rows, fit_ridge
from .softmax import SOFTMAX_STEPS, fit_softmax


def split_indices(n: int, train_fraction: float = 0.7, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Deterministic seeded train/held-out split of ``n`` probe images (independent of the global RNG)."""
    if n < 4:
        raise ValueError(f"need at least 4 probe images for a train/held-out split, got {n}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_train = min(max(2, round(n * train_fraction)), n - 2)
    return order[:n_train], order[n_train:]


#: Values of each image read into its content key: a strided sample, so keying 256 ImageNet-sized images costs a
#: few milliseconds, not a pass over 150 MB.
KEY_VALUES = 4096


def content_order(images: Tensor) -> Tensor:
    """Indices that sort ``images`` (B, ...) by a hash of their values (up to `KEY_VALUES` of each, as
    float32 bytes): the same images in any order sort into the same sequence (identical images keep their order)."""
    flat = images.detach().flatten(1)
    sampled = flat[:, ::max(1, -(-flat.shape[1] // KEY_VALUES))].to("cpu", torch.float32).contiguous().numpy()
    keys = [hashlib.blake2b(row.tobytes(), digest_size=16).digest() for row in sampled]
    return torch.tensor(sorted(range(len(keys)), key=keys.__getitem__), dtype=torch.long)


def split_images(images: Tensor, train_fraction: float = 0.7, seed: int = 0) -> tuple[Tensor, Tensor]:
    """`split_indices` over ``images`` ranked by content (`content_order`): which images train and
    which are held out depends on the images and the seed, not on their order, so every caller that measures the
    same images (Watch, ``analyze``, the demo) gets the same probes. Each part lists its images in content order."""
    ranked = content_order(images)
    train, test = split_indices(len(ranked), train_fraction, seed)
    return ranked[train.sort().values], ranked[test.sort().values]


def label_codes(labels: Tensor) -> tuple[Tensor, int]:
    """Class codes 0..C−1 of ``labels`` (B,) and C, read on the host once: callers that probe the same labels again
    (`isiwatch.measure.probe_batch.ProbeBatch`) keep them, so no probe reads the device."""
    _, codes = torch.unique(labels.cpu(), return_inverse=True)
    return codes, int(codes.max()) + 1


def probe_accuracy(
    features: Tensor,
    labels: Tensor,
    train_idx: Tensor,
    test_idx: Tensor,
    alphas: Sequence[float] = DEFAULT_ALPHAS,
    softmax_steps: int = SOFTMAX_STEPS,
) -> Tensor:
    """Held-out accuracy (K,) of one multinomial logistic-regression classifier per feature set ``features``
    (K,n,D), on standardised features.

    One batched ridge solve on one-hot labels (regulariser chosen per feature set by leave-one-out accuracy on
    the training split) starts ``softmax_steps`` batched steps on the softmax loss (`isiwatch.measure.softmax`;
    0 keeps the ridge classifiers). A feature set with a non-finite value reads NaN; the others are unaffected.
    """
    codes, classes = label_codes(labels)
    codes = codes.to(features.device)
    return coded_probe_correct(features, codes, F.one_hot(codes, classes).float(), train_idx.to(features.device),
                               test_idx.to(features.device), alphas, softmax_steps).mean(-1)


def coded_probe_correct(features: Tensor, codes: Tensor, onehot: Tensor, train_idx: Tensor, test_idx: Tensor,
                        alphas: Sequence[float] = DEFAULT_ALPHAS, softmax_steps: int = SOFTMAX_STEPS) -> Tensor:
    """Which held-out images (``test_idx``, in its order) each probe of `probe_accuracy` classifies correctly:
    (K,m), 1.0 right and 0.0 wrong, its mean over the images the held-out accuracy. Label ``codes`` (n,) and their
    ``onehot`` (n,C) and everything else on the features' device: no value is read on the host. Non-finite feature
    sets are fitted as zeros and their rows read NaN. The per-image predictions are what a paired test of two probes
    on the same images needs (`isiwatch.watch.probe_evidence`)."""
    features = features.float()
    lowest, highest = torch.aminmax(features.flatten(1), dim=1)  # one pass, no copy; NaN and ±inf propagate
    finite = torch.isfinite(lowest) & torch.isfinite(highest)
    features = torch.where(finite.view(-1, 1, 1), features, 0.0)
    y_train = codes[train_idx]
    fit = fit_ridge(features[:, train_idx], onehot[train_idx], lambda pred: accuracy_score(pred, y_train), alphas)
    if softmax_steps:
        fit = fit_softmax(fit, onehot[train_idx], softmax_steps)
    correct = correct_rows(fit.predict(features[:, test_idx]), codes[test_idx])
    return torch.where(finite.view(-1, 1), correct, torch.nan)
