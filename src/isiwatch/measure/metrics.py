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
    """Dot products along the last dimension, broadcasting the others. ``linalg.vecdot`` forms the elementwise product
    first, so callers pass one chunk of images (`TOKEN_CHUNK`): on chunks it is 2.5–3.5× faster than an
    einsum (a batched matmul of 1×D rows), on a whole ViT-S-sized batch (256×197×384) the temporary costs 4×."""
    dots: Tensor = torch.linalg.vecdot(a, b)
    return dots


def _squared_norm(t: Tensor) -> Tensor:
    """‖t‖² along the last dimension: one reduction that writes no elementwise temporary (``_dot(t, t)`` writes
    one), a third faster on a chunk."""
    squared: Tensor = torch.linalg.vector_norm(t, dim=-1).square()
    return squared


def _norm(squared: Tensor) -> Tensor:
    """max(‖t‖, EPS) from ‖t‖², as ``F.normalize`` divides by it."""
    return squared.sqrt().clamp_min(EPS)


def attention_stats(scores: AttentionScores, p: int, has_cls: bool) -> tuple[Tensor, Tensor | None]:
    """(attn_entropy, cls_attention_share) per image from a block's attention (its per-row statistics,
    `row_stats`).

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


def patch_center(z: Tensor, p: int) -> Tensor:
    """The mean patch token of the batch (all images, all positions), (D,)."""
    patches = z[:, p:]
    return patches.sum(0).mean(0) / len(patches)  # as mean((0, 1)), which is 10× slower on CPU


def token_similarity(z: Tensor, p: int, center: Tensor | None = None) -> Tensor:
    """Centred mean pairwise cosine between an image's patch tokens (i ≠ j), in O(N·D) via ‖Σu‖².

    ``center`` defaults to the mean patch token of the whole batch (all images, all positions). The centred
    tokens are formed (not expanded as ‖z‖² − 2 z·center + ‖center‖², which loses all precision when tokens
    collapse onto the centre, the case this metric exists to see) but never normalised into a copy.
    """
    patches = z[:, p:]
    v = patches - (patch_center(z, p) if center is None else center)
    vv = _squared_norm(v)
    w = 1.0 / _norm(vv)  # u_i = w_i v_i
    n = v.shape[1]
    total = torch.bmm(w.unsqueeze(1), v).squeeze(1)  # Σ u_i
    pair_sum = _squared_norm(total) - (w * w * vv).sum(-1)
    return pair_sum / (n * (n - 1))


def _cls_patch_cos(t: Tensor, squared: Tensor, p: int) -> Tensor:
    """Mean cos([CLS], patch_i) from the tokens and their squared norms."""
    dots = _dot(t[:, p:], t[:, :1])  # [CLS] broadcast over the patches
    return (dots / _norm(squared[:, p:])).mean(-1) / _norm(squared[:, 0])


def cls_patch_cos(z: Tensor, p: int) -> Tensor:
    """Mean cos([CLS], patch_i)."""
    return _cls_patch_cos(z, _squared_norm(z), p)


def norm_friction(x: Tensor, x_normed: Tensor, p: int) -> Tensor:
    """cls_patch_cos before minus after norm1: how much the norm layer separates [CLS] from patches."""
    return cls_patch_cos(x, p) - cls_patch_cos(x_normed, p)


#: Elements of one (b,T,D) activation handled per chunk of images by `block_metrics`, so that its passes over
#: a block's tensors stay in cache: on ViT-S-sized activations (256×197×384) passes over the whole batch cost about
#: twice as much.
TOKEN_CHUNK = 1 << 19


def _token_metrics(x: Tensor, x_normed: Tensor, branch: Tensor, z: Tensor, p: int, has_cls: bool,
                   center: Tensor) -> dict[str, Tensor]:
    """The metrics of `block_metrics` that read the tokens, for one chunk of images."""
    xx, zz, xb = _squared_norm(x), _squared_norm(z), _dot(x, branch)
    nx = _norm(xx)
    ny = _norm((xx + 2 * xb + _squared_norm(branch)).clamp_min(0))
    out = {"attn_token_change": 1.0 - ((xx + xb) / (nx * ny)).mean(-1),
           "token_similarity": token_similarity(z, p, center),
           "block_influence": 1.0 - (_dot(x, z) / (nx * _norm(zz))).mean(-1)}
    if has_cls:
        out["cls_patch_cos"] = _cls_patch_cos(z, zz, p)
        out["norm_friction"] = _cls_patch_cos(x, xx, p) - cls_patch_cos(x_normed, p)
    return out


def block_metrics(bt: BlockTensors) -> dict[str, Tensor]:
    """Per-image metrics of one block (``isi`` is formed from their batch means); the [CLS] metrics only when
    the block's sequence has a [CLS].

    ``block_influence`` is ShortGPT's block influence, 1 − cos(X, Z) between the block's input and output
    averaged over tokens: 0 for a block that changes nothing. Cosines come from per-token dot products and
    squared norms (Y = X + branch is never formed), so each tensor is read a few times and no normalised copy
    is written, chunk by chunk of images (`TOKEN_CHUNK`).
    """
    p, z = bt.p, bt.z
    center = patch_center(z, p)
    step = max(1, TOKEN_CHUNK // z[0].numel())
    chunks = [_token_metrics(bt.x[i:i + step], bt.x_normed[i:i + step], bt.branch[i:i + step], z[i:i + step], p,
                             bt.has_cls, center) for i in range(0, len(z), step)]
    tokens = {name: torch.cat([chunk[name] for chunk in chunks]) for name in chunks[0]}
    entropy, share = attention_stats(bt.attention, p, bt.has_cls)
    out = {"attn_token_change": tokens["attn_token_change"], "attn_entropy": entropy,
           "token_similarity": tokens["token_similarity"], "block_influence": tokens["block_influence"]}
    if bt.has_cls:
        assert share is not None  # attention_stats returns a share whenever has_cls
        out["cls_attention_share"] = share
        out["cls_patch_cos"] = tokens["cls_patch_cos"]
        out["norm_friction"] = tokens["norm_friction"]
    return out
