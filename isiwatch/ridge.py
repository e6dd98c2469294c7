"""Closed-form ridge regression for many problems at once, with the regulariser chosen by leave-one-out.

Used by the linear probes and by ``isi_recon``: K independent problems (one per layer and feature kind)
share one batched spectral decomposition, and the exact leave-one-out residuals of ridge, ``(y − ŷ)/(1 − h)``, pick the
regulariser from a grid on the training data alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

#: Regularisers, relative to the mean squared singular value of the standardised features.
DEFAULT_ALPHAS = tuple(10.0 ** e for e in range(-4, 3))


@dataclass
class RidgeFit:
    """K fitted ridge maps on standardised features; ``alpha`` is the chosen relative regulariser."""

    mean: Tensor  # (K,1,D)
    scale: Tensor  # (K,1,D)
    weights: Tensor  # (K,D,C)
    bias: Tensor  # (K,1,C)
    alpha: Tensor  # (K,)
    #: (U (K,n,r), s (K,r), V (K,D,r)): thin SVD of the standardised training features, for refinements.
    spectrum: tuple[Tensor, Tensor, Tensor] | None = None

    def predict(self, x: Tensor) -> Tensor:
        """(K,m,D) features → (K,m,C) predictions."""
        return ((x - self.mean) / self.scale) @ self.weights + self.bias


def accuracy_score(pred: Tensor, labels: Tensor) -> Tensor:
    """Fraction of rows whose arg-max is the label; (K,n,C), (n,) → (K,)."""
    return (pred.argmax(-1) == labels).float().mean(-1)


def neg_mse_score(pred: Tensor, target: Tensor) -> Tensor:
    """Negative mean squared error; higher is better."""
    return -(pred - target).pow(2).mean((-2, -1))


def _spectrum(xs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Thin SVD (U, s, V) of each (n,D) problem via the eigendecomposition of its smaller Gram matrix.

    The Gram matrix is (D,D) or (n,n), decomposed in float64; much cheaper than an SVD of the tall
    matrix. Directions with negligible singular values get s = 0 and zero vectors, so they drop out.
    """
    primal = xs.shape[2] <= xs.shape[1]
    gram = xs.transpose(1, 2) @ xs if primal else xs @ xs.transpose(1, 2)
    s2, vecs = torch.linalg.eigh(gram.double())
    keep = s2 > 1e-10 * s2[:, -1:].clamp_min(1e-300)
    s = torch.where(keep, s2.clamp_min(0).sqrt(), 0).to(xs.dtype)
    inv = torch.where(keep, 1 / s.clamp_min(1e-30), 0)
    vecs = vecs.to(xs.dtype)
    if primal:
        return (xs @ vecs) * inv.unsqueeze(1), s, vecs * keep.unsqueeze(1)
    return vecs * keep.unsqueeze(1), s, (xs.transpose(1, 2) @ vecs) * inv.unsqueeze(1)


def fit_ridge(
    x: Tensor,
    y: Tensor,
    score: Callable[[Tensor], Tensor],
    alphas: Sequence[float] = DEFAULT_ALPHAS,
) -> RidgeFit:
    """Fit K ridge problems ``x`` (K,n,D) → ``y`` (n,C) or (K,n,C) with an intercept.

    ``score(loo_predictions (K,n,C)) -> (K,)`` rates each candidate regulariser (higher is better); ties
    go to the stronger regulariser.
    """
    k, n, _ = x.shape
    mean = x.mean(1, keepdim=True)
    scale = x.std(1, keepdim=True).clamp_min(1e-6)
    xs = (x - mean) / scale
    y = y.expand(k, *y.shape[-2:]) if y.dim() == 2 else y
    y_bar = y.mean(1, keepdim=True)
    yc = y - y_bar
    u, s, v = _spectrum(xs)
    s2 = s.pow(2)
    u_t_y = u.transpose(1, 2) @ yc  # (K,r,C)
    u2 = u.pow(2)
    best_score = torch.full((k,), -torch.inf, device=x.device)
    best_lam = torch.zeros(k, 1, device=x.device)
    best_alpha = torch.zeros(k, device=x.device)
    for alpha in alphas:
        lam = alpha * s2.mean(-1, keepdim=True)  # (K,1)
        shrink = s2 / (s2 + lam)  # (K,r)
        fitted = u @ (shrink.unsqueeze(-1) * u_t_y)
        leverage = (u2 @ shrink.unsqueeze(-1)) + 1.0 / n  # (K,n,1)
        loo = yc - (yc - fitted) / (1.0 - leverage).clamp_min(1e-6)
        sc = score(loo + y_bar)
        better = sc >= best_score
        best_score = torch.where(better, sc, best_score)
        best_lam = torch.where(better.unsqueeze(-1), lam, best_lam)
        best_alpha = torch.where(better, torch.as_tensor(alpha, device=x.device), best_alpha)
    coef = s / (s2 + best_lam)  # (K,r)
    weights = v @ (coef.unsqueeze(-1) * u_t_y)
    return RidgeFit(mean, scale, weights, y_bar, best_alpha, (u, s, v))
