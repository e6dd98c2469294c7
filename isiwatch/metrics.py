"""Per-layer metrics of SPEC §3, computed from one block's tensors.

Every function returns one value per image (shape (B,)), so that a caller can average over several
probe chunks; all inputs are fp32. ``p`` is the number of prefix tokens ([CLS] first).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .taps import BlockTensors

#: Metrics computed on every block, in the order they are reported.
BLOCK_METRICS = ("attn_token_change", "attn_entropy", "isi", "token_similarity", "cls_attention_share",
                 "cls_patch_cos", "norm_friction")
#: Metrics that need a [CLS] token.
CLS_METRICS = ("cls_attention_share", "cls_patch_cos", "norm_friction", "probe_cls")


def isi(token_change: float, entropy: float) -> float:
    """Information Scrambling Index, attention form: d · h of the batch-averaged d and h, in [0, 2]."""
    return token_change * entropy


def attn_token_change(x: Tensor, y: Tensor) -> Tensor:
    """d = mean over tokens of 1 − cos(X, Y): how much the attention sub-layer rotates each token."""
    return (1.0 - F.cosine_similarity(x, y, dim=-1)).mean(-1)


def attn_entropy(a: Tensor) -> Tensor:
    """h = mean over heads and queries of the attention row entropy, divided by ln T (0 = one source)."""
    t = a.shape[-1]
    return -torch.special.xlogy(a, a).sum(-1).mean((1, 2)) / math.log(t)


def cls_attention_share(a: Tensor, p: int) -> Tensor:
    """T · mean attention that patch queries pay to [CLS]; 1 means uniform."""
    return a.shape[-1] * a[:, :, p:, 0].mean((1, 2))


def token_similarity(z: Tensor, p: int, center: Tensor | None = None) -> Tensor:
    """Centred mean pairwise cosine between an image's patch tokens (i ≠ j), in O(N·D) via ‖Σu‖².

    ``center`` defaults to the mean patch token of the whole batch (all images, all positions).
    """
    patches = z[:, p:]
    if center is None:
        center = patches.mean((0, 1))
    u = F.normalize(patches - center, dim=-1)
    n = u.shape[1]
    pair_sum = u.sum(1).pow(2).sum(-1) - u.pow(2).sum((1, 2))
    return pair_sum / (n * (n - 1))


def cls_patch_cos(z: Tensor, p: int) -> Tensor:
    """Mean cos([CLS], patch_i)."""
    return F.cosine_similarity(z[:, :1], z[:, p:], dim=-1).mean(-1)


def norm_friction(x: Tensor, x_normed: Tensor, p: int) -> Tensor:
    """cls_patch_cos before minus after norm1: how much the norm layer separates [CLS] from patches."""
    return cls_patch_cos(x, p) - cls_patch_cos(x_normed, p)


def block_metrics(bt: BlockTensors, p: int, has_cls: bool) -> dict[str, Tensor]:
    """Per-image block metrics of SPEC §3 for one block (``isi`` is formed from their batch means)."""
    a = bt.attention_probs()
    d = attn_token_change(bt.x, bt.y)
    h = attn_entropy(a)
    out = {"attn_token_change": d, "attn_entropy": h, "token_similarity": token_similarity(bt.z, p)}
    if has_cls:
        out["cls_attention_share"] = cls_attention_share(a, p)
        out["cls_patch_cos"] = cls_patch_cos(bt.z, p)
        out["norm_friction"] = norm_friction(bt.x, bt.x_normed, p)
    return out
