"""``isi_recon``: the reconstruction form of the Information Scrambling Index (arXiv 2511.21635).

Recipe (per layer, on the patch tokens H (B,N,D) of the layer and the patch embeddings E (B,N,De)
before positional encoding; images split by the probes' seeded train/held-out split):

1. R²_self: for every position i, a ridge map from H[:, i] to E[:, i] (N position-specific maps).
2. R²_all: every token of H is projected onto the top-``k`` principal components of the layer's patch
   tokens (fitted on training images, all positions pooled); the N·k projections of an image are
   concatenated and one ridge map predicts all N·De targets.
3. Both R² are held-out: 1 − Σ(E − Ê)² / Σ(E − mean_train E)², summed over images, positions and dims.
   Ridge regularisers are chosen by leave-one-out squared error on the training images.

``isi_recon = R²_all − R²_self``: positive when the layer's patch information can still be recovered
from the whole image but no longer from each token's own position — it has been scrambled across tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .ridge import fit_ridge, neg_mse_score

#: Principal components kept per token for R²_all.
DEFAULT_RECON_COMPONENTS = 8


def _held_out_r2(pred: Tensor, target: Tensor, train_mean: Tensor) -> Tensor:
    return 1.0 - (target - pred).pow(2).sum() / (target - train_mean).pow(2).sum().clamp_min(1e-12)


def isi_recon(
    tokens: Tensor, targets: Tensor, train_idx: Tensor, test_idx: Tensor, k: int = DEFAULT_RECON_COMPONENTS
) -> Tensor:
    """R²_all − R²_self (a 0-d tensor on the tokens' device) for recovering ``targets`` (B,N,De) from ``tokens``
    (B,N,D); see the module doc. NaN when either holds a non-finite value (they are fitted as zeros)."""
    train_idx, test_idx = train_idx.to(tokens.device), test_idx.to(tokens.device)
    tokens, targets = tokens.float(), targets.float()
    finite = torch.isfinite(tokens).all() & torch.isfinite(targets).all()
    tokens, targets = torch.where(finite, tokens, 0.0), torch.where(finite, targets, 0.0)
    b, n, d = tokens.shape
    train_mean = targets[train_idx].mean(0, keepdim=True)

    per_pos_x, per_pos_y = tokens.transpose(0, 1), targets.transpose(0, 1)  # (N,B,D), (N,B,De)
    y_train = per_pos_y[:, train_idx]
    fit = fit_ridge(per_pos_x[:, train_idx], y_train, lambda p: neg_mse_score(p, y_train))
    r2_self = _held_out_r2(fit.predict(per_pos_x[:, test_idx]).transpose(0, 1), targets[test_idx], train_mean)

    pooled = tokens[train_idx].reshape(-1, d)
    centre = pooled.mean(0)
    cov = ((pooled - centre).T @ (pooled - centre)).double()
    vecs = torch.linalg.eigh(cov).eigenvectors.to(tokens.dtype)
    basis = vecs[:, -min(k, d):]  # top components (eigh sorts ascending)
    flat = ((tokens - centre) @ basis).reshape(1, b, -1)
    flat_y = targets.reshape(1, b, -1)
    y_train = flat_y[:, train_idx]
    fit = fit_ridge(flat[:, train_idx], y_train, lambda p: neg_mse_score(p, y_train))
    r2_all = _held_out_r2(fit.predict(flat[:, test_idx]).reshape(-1, n, targets.shape[-1]),
                          targets[test_idx], train_mean)
    return torch.where(finite, r2_all - r2_self, torch.nan)

