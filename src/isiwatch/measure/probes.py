"""Linear probes: held-out accuracy of softmax classifiers on per-layer features, all layers solved together."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .ridge import DEFAULT_ALPHAS, accuracy_score, fit_ridge
from .softmax import SOFTMAX_STEPS, fit_softmax


def split_indices(n: int, train_fraction: float = 0.7, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Deterministic seeded train/held-out split of ``n`` probe images (independent of the global RNG)."""
    if n < 4:
        raise ValueError(f"need at least 4 probe images for a train/held-out split, got {n}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_train = min(max(2, round(n * train_fraction)), n - 2)
    return order[:n_train], order[n_train:]


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
    the training split) starts ``softmax_steps`` batched steps on the softmax loss (:mod:`isiwatch.measure.softmax`;
    0 keeps the ridge classifiers).
    """
    features = features.float()
    finite = torch.isfinite(features).all(-1).all(-1)
    if not bool(finite.all()):  # non-finite activations: those probes are NaN, the rest still run
        out = torch.full((len(features),), torch.nan, device=features.device)
        if bool(finite.any()):
            out[finite] = probe_accuracy(features[finite], labels, train_idx, test_idx, alphas, softmax_steps)
        return out
    _, codes = torch.unique(labels.cpu(), return_inverse=True)
    codes = codes.to(features.device)
    onehot = F.one_hot(codes, int(codes.max()) + 1).float()
    train_idx, test_idx = train_idx.to(features.device), test_idx.to(features.device)
    y_train = codes[train_idx]
    fit = fit_ridge(features[:, train_idx], onehot[train_idx], lambda pred: accuracy_score(pred, y_train), alphas)
    if softmax_steps:
        fit = fit_softmax(fit, onehot[train_idx], softmax_steps)
    return accuracy_score(fit.predict(features[:, test_idx]), codes[test_idx])
