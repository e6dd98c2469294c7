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
BLOCK_METRICS = ("attn_token_change", "attn_entropy", "isi", "token_similarity", "block_influence",
                 "cls_attention_share", "cls_patch_cos", "norm_friction")
#: Metrics that need a [CLS] token.
CLS_METRICS = ("cls_attention_share", "cls_patch_cos", "norm_friction", "probe_cls")


def isi(token_change: float, entropy: float) -> float:
    """Information Scrambling Index, attention form: d · h of the batch-averaged d and h, in [0, 2]."""
    return token_change * entropy


def unit(t: Tensor) -> Tensor:
    """Tokens scaled to unit L2 norm (zero tokens stay zero)."""
    return F.normalize(t, dim=-1)


def attn_token_change(x: Tensor, y: Tensor) -> Tensor:
    """d = mean over tokens of 1 − cos(X, Y): how much the attention sub-layer rotates each token."""
    return _token_change(unit(x), unit(y))


def _token_change(ux: Tensor, uy: Tensor) -> Tensor:
    return 1.0 - torch.linalg.vecdot(ux, uy).mean(-1)


#: Attention scores handled per chunk of images (elements), so the softmax passes stay in cache.
SCORE_CHUNK = 1 << 19


def attention_stats(q: Tensor, k: Tensor, scale: float, p: int, has_cls: bool) -> tuple[Tensor, Tensor | None]:
    """(attn_entropy, cls_attention_share) per image from q, k (B,H,T,hd), without materialising log A.

    Entropy of a softmax row is ``logsumexp(s) − Σ A·s``, normalised by ln T (0 = one source, 1 = uniform);
    the [CLS] share is T · mean attention that patch queries pay to [CLS] (1 = uniform).
    """
    b, h, t, _ = q.shape
    step = max(1, SCORE_CHUNK // (h * t * t))
    entropy = q.new_empty(b)
    share = q.new_empty(b) if has_cls else None
    for i in range(0, b, step):
        scores = torch.matmul(q[i:i + step], k[i:i + step].transpose(-2, -1)).mul_(scale)
        lse = scores.logsumexp(-1, keepdim=True)
        a = (scores - lse).exp_()
        entropy[i:i + step] = (lse.squeeze(-1) - torch.linalg.vecdot(a, scores)).mean((1, 2))
        if share is not None:
            share[i:i + step] = a[:, :, p:, 0].mean((1, 2))
    entropy /= math.log(t)
    return entropy, share * t if share is not None else None


def token_similarity(z: Tensor, p: int, center: Tensor | None = None) -> Tensor:
    """Centred mean pairwise cosine between an image's patch tokens (i ≠ j), in O(N·D) via ‖Σu‖².

    ``center`` defaults to the mean patch token of the whole batch (all images, all positions).
    """
    patches = z[:, p:]
    if center is None:
        center = patches.mean((0, 1))
    u = unit(patches - center)
    n = u.shape[1]
    pair_sum = u.sum(1).pow(2).sum(-1) - u.pow(2).sum((1, 2))
    return pair_sum / (n * (n - 1))


def cls_patch_cos(z: Tensor, p: int) -> Tensor:
    """Mean cos([CLS], patch_i)."""
    return _cls_patch_cos(unit(z), p)


def _cls_patch_cos(u: Tensor, p: int) -> Tensor:
    return torch.linalg.vecdot(u[:, p:].mean(1), u[:, 0])


def norm_friction(x: Tensor, x_normed: Tensor, p: int) -> Tensor:
    """cls_patch_cos before minus after norm1: how much the norm layer separates [CLS] from patches."""
    return cls_patch_cos(x, p) - cls_patch_cos(x_normed, p)


def block_metrics(bt: BlockTensors, p: int, has_cls: bool) -> dict[str, Tensor]:
    """Per-image block metrics of SPEC §3 for one block (``isi`` is formed from their batch means).

    ``block_influence`` is ShortGPT's block influence, 1 − cos(X, Z) between the block's input and output
    averaged over tokens: 0 for a block that changes nothing. Each tensor is normalised once and shared
    between the metrics that need it.
    """
    ux = unit(bt.x)
    entropy, share = attention_stats(bt.q, bt.k, bt.scale, p, has_cls)
    out = {"attn_token_change": _token_change(ux, unit(bt.y)), "attn_entropy": entropy,
           "token_similarity": token_similarity(bt.z, p), "block_influence": _token_change(ux, unit(bt.z))}
    if has_cls:
        out["cls_attention_share"] = share
        out["cls_patch_cos"] = cls_patch_cos(bt.z, p)
        out["norm_friction"] = _cls_patch_cos(ux, p) - cls_patch_cos(bt.x_normed, p)
    return out
