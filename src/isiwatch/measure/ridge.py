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

from .readback import on_device

#: Regularisers, relative to the mean squared singular value of the standardised features.
DEFAULT_ALPHAS = tuple(10.0 ** e for e in range(-4, 3))
#: Bytes of leave-one-out predictions the regulariser grid may hold at once ((A,K,C,n) fp32): all of it for the
#: probes; a few regularisers per pass for ``isi_recon``'s thousands of targets.
RIDGE_BYTES = 1 << 28


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
        """(K,m,D) features → (K,m,C) predictions (a transposed view: formed target-major, as in `fit_ridge`)."""
        xs = (x - self.mean) / self.scale
        return (self.weights.transpose(1, 2) @ xs.transpose(1, 2) + self.bias.transpose(1, 2)).transpose(1, 2)


def correct_rows(pred: Tensor, labels: Tensor) -> Tensor:
    """1.0 for each row whose arg-max (the first, on ties) is the label, else 0.0; (...,n,C), (n,) → (...,n)."""
    return (pred.max(-1).indices == labels).float()


def accuracy_score(pred: Tensor, labels: Tensor) -> Tensor:
    """Fraction of rows whose arg-max (the first, on ties) is the label; (K,n,C), (n,) → (K,)."""
    return correct_rows(pred, labels).mean(-1)


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
    if primal:  # U formed as Uᵀ (r,n) and returned as its transposed view: the product with n columns is faster
        u_t = (vecs.transpose(1, 2) @ xs.transpose(1, 2)) * inv.unsqueeze(-1)
        return u_t.transpose(1, 2), s, vecs * keep.unsqueeze(1)
    return vecs * keep.unsqueeze(1), s, (xs.transpose(1, 2) @ vecs) * inv.unsqueeze(1)


def fit_ridge(
    x: Tensor,
    y: Tensor,
    score: Callable[[Tensor], Tensor],
    alphas: Sequence[float] = DEFAULT_ALPHAS,
) -> RidgeFit:
    """Fit K ridge problems ``x`` (K,n,D) → ``y`` (n,C) or (K,n,C) with an intercept.

    ``score(loo_predictions (A,K,n,C)) -> (A,K)`` rates the candidate regularisers (higher is better), all of them
    at once where `RIDGE_BYTES` allows; ties go to the stronger regulariser. Predictions are formed target-major,
    (K,C,n), and handed to ``score`` as a transposed view: with few targets, the products with n columns are several
    times faster than those with C.
    """
    k, n, _ = x.shape
    mean = x.mean(1, keepdim=True)
    centred = x - mean
    # the unbiased std, summed by hand: torch's std along a middle dimension is about 10× slower
    scale = (centred.pow(2).sum(1, keepdim=True) / max(n - 1, 1)).sqrt().clamp_min(1e-6)
    xs = centred / scale
    y_t = y.transpose(-2, -1)  # (C,n) or (K,C,n)
    y_bar = y_t.mean(-1, keepdim=True)
    yc = (y_t - y_bar).expand(k, *y_t.shape[-2:])
    u, s, v = _spectrum(xs)
    u_t = u.transpose(1, 2).contiguous()  # (K,r,n)
    s2 = s.pow(2)
    y_u = torch.bmm(yc, u)  # (K,C,r)
    # every regulariser at once, as a leading (A,) dimension: λ = α · mean s²
    grid = on_device(tuple(alphas), x.device, x.dtype)
    lam = grid.view(-1, 1, 1) * s2.mean(-1, keepdim=True)  # (A,K,1)
    u2_t = u_t.pow(2)

    def loo_scores(lam: Tensor) -> Tensor:
        # the regularisers ride in the rows of one matmul per problem: broadcasting U over them would copy it A times
        a, c = lam.shape[0], yc.shape[-2]
        shrink = torch.where(s2 > 0, s2 / (s2 + lam), 0).transpose(0, 1)  # (K,A,r); 0/0 on constant features
        scaled = (y_u.unsqueeze(1) * shrink.unsqueeze(2)).reshape(k, a * c, -1)  # (K,A·C,r)
        fitted = torch.bmm(scaled, u_t).view(k, a, c, n).transpose(0, 1)  # (A,K,C,n)
        leverage = (torch.bmm(shrink, u2_t) + 1.0 / n).transpose(0, 1).unsqueeze(2)  # (A,K,1,n)
        loo = yc - (yc - fitted) / (1.0 - leverage).clamp_min(1e-6)
        return score((loo + y_bar).transpose(-2, -1))  # (A,K)

    per_pass = max(1, RIDGE_BYTES // (4 * yc.numel()))  # regularisers per pass, each (K,C,n)
    scores = loo_scores(lam) if per_pass >= len(alphas) else torch.cat(
        [loo_scores(lam[i:i + per_pass]) for i in range(0, len(alphas), per_pass)])
    # the best score, ties to the stronger regulariser (the last of the increasing grid)
    best = len(alphas) - 1 - scores.flip(0).argmax(0)
    best_lam = lam.squeeze(-1).gather(0, best.unsqueeze(0)).view(k, 1)
    best_alpha = grid[best]
    coef = torch.where(s > 0, s / (s2 + best_lam), 0).unsqueeze(1)  # (K,1,r)
    weights = ((y_u * coef) @ v.transpose(1, 2)).transpose(1, 2)  # (K,D,C), a view of (K,C,D)
    return RidgeFit(mean, scale, weights, y_bar.expand(k, *y_bar.shape[-2:]).transpose(1, 2), best_alpha, (u, s, v))
