"""Per-layer metrics of a ViT block (token change, attention entropy, ISI, token similarity, block influence,
[CLS] share and alignment, norm friction), computed from the block's tensors.

Every function returns one value per image (shape (B,)), so that a caller can average over several
probe chunks; all inputs are fp32. ``p`` is the number of prefix tokens ([CLS] first).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from .taps import AttentionScores, BlockTensors

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


def attention_stats(scores: AttentionScores, p: int, has_cls: bool) -> tuple[Tensor, Tensor | None]:
    """(attn_entropy, cls_attention_share) per image from a block's attention scores, chunk by chunk.

    Entropy of a softmax row is ``logsumexp(s) − Σ A·s``, normalised by ln Tk (0 = one source, 1 = uniform);
    masked (−inf) scores carry no probability and add nothing. The [CLS] share is Tk · mean attention that
    patch queries pay to [CLS] (1 = uniform); NaN where patches do not query (CaiT's class attention).
    """
    b, h, tq, tk = scores.shape
    step = max(1, SCORE_CHUNK // (h * tq * tk))
    entropy = torch.empty(b, device=_device(scores))
    share = torch.full((b,), math.nan, device=entropy.device) if has_cls else None
    masked = scores.masked
    for i in range(0, b, step):
        s = scores.scores(i, i + step)
        lse = s.logsumexp(-1, keepdim=True)
        a = (s - lse).exp()
        if masked:
            s = s.clamp_min(torch.finfo(s.dtype).min)  # 0 · (−inf) would be NaN; 0 · min is 0
        entropy[i:i + step] = (lse.squeeze(-1) - torch.linalg.vecdot(a, s)).mean((1, 2))
        if share is not None and tq == tk:
            share[i:i + step] = a[:, :, p:, 0].mean((1, 2)) * tk
    entropy /= math.log(tk)
    return entropy, share


def _device(scores: AttentionScores) -> torch.device:
    return (scores.logits if scores.logits is not None else scores.q).device


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


def block_metrics(bt: BlockTensors) -> dict[str, Tensor]:
    """Per-image metrics of one block (``isi`` is formed from their batch means); the [CLS] metrics only when
    the block's sequence has a [CLS].

    ``block_influence`` is ShortGPT's block influence, 1 − cos(X, Z) between the block's input and output
    averaged over tokens: 0 for a block that changes nothing. Each tensor is normalised once and shared
    between the metrics that need it.
    """
    p = bt.p
    ux = unit(bt.x)
    entropy, share = attention_stats(bt.attention, p, bt.has_cls)
    out = {"attn_token_change": _token_change(ux, unit(bt.y)), "attn_entropy": entropy,
           "token_similarity": token_similarity(bt.z, p), "block_influence": _token_change(ux, unit(bt.z))}
    if bt.has_cls:
        out["cls_attention_share"] = share
        out["cls_patch_cos"] = cls_patch_cos(bt.z, p)
        out["norm_friction"] = _cls_patch_cos(ux, p) - cls_patch_cos(bt.x_normed, p)
    return out
