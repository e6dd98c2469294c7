"""Per-layer metrics of a ViT block (token change, attention entropy, ISI, token similarity, block influence,
[CLS] share and alignment, norm friction), computed from the block's tensors.

Every function returns one value per image (shape (B,)), so that a caller can average over several
probe chunks; all inputs are fp32. ``p`` is the number of prefix tokens ([CLS] first).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..taps import AttentionScores, BlockTensors

#: Metrics computed on every block, in the order they are reported.
BLOCK_METRICS = ("attn_token_change", "attn_entropy", "isi", "token_similarity", "block_influence",
                 "cls_attention_share", "cls_patch_cos", "norm_friction")
#: Metrics that need a [CLS] token.
CLS_METRICS = ("cls_attention_share", "cls_patch_cos", "norm_friction", "probe_cls")


def isi(token_change: float, entropy: float) -> float:
    """Information Scrambling Index, attention form: d · h of the batch-averaged d and h, in [0, 2]."""
    return token_change * entropy


#: ``F.normalize``'s floor on a norm: a zero token has cosine 0 with everything.
EPS = 1e-12


def _dot(a: Tensor, b: Tensor) -> Tensor:
    dots: Tensor = torch.linalg.vecdot(a, b)
    return dots


def _norm(squared: Tensor) -> Tensor:
    """max(‖t‖, EPS) from ‖t‖², as ``F.normalize`` divides by it."""
    return squared.sqrt().clamp_min(EPS)


def attention_stats(scores: AttentionScores, p: int, has_cls: bool) -> tuple[Tensor, Tensor | None]:
    """(attn_entropy, cls_attention_share) per image from a block's attention (its per-row statistics,
    :meth:`~isiwatch.taps.AttentionScores.row_stats`).

    The entropy is averaged over heads and query rows and normalised by ln Tk (0 = one source, 1 = uniform); masked
    (−inf) scores carry no probability and add nothing. The [CLS] share is Tk · mean attention that patch queries
    pay to [CLS] (1 = uniform); NaN where patches do not query (CaiT's class attention).
    """
    rows = scores.row_stats()
    b, _, tq, tk = scores.shape
    entropy = rows.entropy.mean((1, 2)) / math.log(tk)
    share = None
    if has_cls:
        share = rows.first[:, :, p:].mean((1, 2)) * tk if tq == tk else torch.full((b,), math.nan,
                                                                                 device=entropy.device)
    return entropy, share


def token_similarity(z: Tensor, p: int, center: Tensor | None = None) -> Tensor:
    """Centred mean pairwise cosine between an image's patch tokens (i ≠ j), in O(N·D) via ‖Σu‖².

    ``center`` defaults to the mean patch token of the whole batch (all images, all positions). The centred
    tokens are formed (not expanded as ‖z‖² − 2 z·center + ‖center‖², which loses all precision when tokens
    collapse onto the centre, the case this metric exists to see) but never normalised into a copy.
    """
    patches = z[:, p:]
    if center is None:
        center = patches.sum(0).mean(0) / len(patches)  # as mean((0, 1)), which is 10× slower on CPU
    v = patches - center
    vv = _dot(v, v)
    w = 1.0 / _norm(vv)  # u_i = w_i v_i
    n = v.shape[1]
    total = torch.bmm(w.unsqueeze(1), v).squeeze(1)  # Σ u_i
    pair_sum = _dot(total, total) - (w * w * vv).sum(-1)
    return pair_sum / (n * (n - 1))


def _cls_patch_cos(t: Tensor, squared: Tensor, p: int) -> Tensor:
    """Mean cos([CLS], patch_i) from the tokens and their squared norms."""
    dots = _dot(t[:, p:], t[:, :1])  # broadcast over patches: 4× faster than a (B,N,D)×(B,D,1) bmm on CPU
    return (dots / _norm(squared[:, p:])).mean(-1) / _norm(squared[:, 0])


def cls_patch_cos(z: Tensor, p: int) -> Tensor:
    """Mean cos([CLS], patch_i)."""
    return _cls_patch_cos(z, _dot(z, z), p)


def norm_friction(x: Tensor, x_normed: Tensor, p: int) -> Tensor:
    """cls_patch_cos before minus after norm1: how much the norm layer separates [CLS] from patches."""
    return cls_patch_cos(x, p) - cls_patch_cos(x_normed, p)


def block_metrics(bt: BlockTensors) -> dict[str, Tensor]:
    """Per-image metrics of one block (``isi`` is formed from their batch means); the [CLS] metrics only when
    the block's sequence has a [CLS].

    ``block_influence`` is ShortGPT's block influence, 1 − cos(X, Z) between the block's input and output
    averaged over tokens: 0 for a block that changes nothing. Cosines come from per-token dot products and
    squared norms (Y = X + branch is never formed), so each tensor is read a few times and no normalised copy
    is written.
    """
    p, x, z, branch = bt.p, bt.x, bt.z, bt.branch
    xx, zz, xb = _dot(x, x), _dot(z, z), _dot(x, branch)
    nx = _norm(xx)
    ny = _norm((xx + 2 * xb + _dot(branch, branch)).clamp_min(0))
    entropy, share = attention_stats(bt.attention, p, bt.has_cls)
    out = {"attn_token_change": 1.0 - ((xx + xb) / (nx * ny)).mean(-1), "attn_entropy": entropy,
           "token_similarity": token_similarity(z, p),
           "block_influence": 1.0 - (_dot(x, z) / (nx * _norm(zz))).mean(-1)}
    if bt.has_cls:
        assert share is not None  # attention_stats returns a share whenever has_cls
        out["cls_attention_share"] = share
        out["cls_patch_cos"] = _cls_patch_cos(z, zz, p)
        out["norm_friction"] = _cls_patch_cos(x, xx, p) - cls_patch_cos(bt.x_normed, p)
    return out
