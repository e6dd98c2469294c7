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


#: Attention scores handled per chunk of images (elements), so the softmax passes stay in cache.
SCORE_CHUNK = 1 << 19


def attention_stats(scores: AttentionScores, p: int, has_cls: bool) -> tuple[Tensor, Tensor | None]:
    """(attn_entropy, cls_attention_share) per image from a block's attention scores, chunk by chunk.

    With m the row maximum and e = exp(s − m), the softmax row is e / Σe and its entropy is
    ``ln Σe − Σ e·(s − m) / Σe``: one exponential per score, and no copy of the scores beyond e (the shift is
    made in place in scores formed for this chunk, never in the model's own logits). It is normalised by ln Tk
    (0 = one source, 1 = uniform); masked (−inf) scores carry no probability and add nothing. The [CLS] share is
    Tk · mean attention that patch queries pay to [CLS] (1 = uniform); NaN where patches do not query (CaiT's class
    attention).
    """
    b, h, tq, tk = scores.shape
    step = max(1, SCORE_CHUNK // (h * tq * tk))
    entropy = torch.empty(b, device=_device(scores))
    share = torch.full((b,), math.nan, device=entropy.device) if has_cls else None
    masked = scores.masked
    formed = scores.logits is None  # the scores are formed anew per chunk (not the model's own logits): reusable
    for i in range(0, b, step):
        s = scores.scores(i, i + step)
        peak = s.amax(-1, keepdim=True)
        shifted = s.sub_(peak) if formed else s - peak
        e = shifted.exp()
        total = e.sum(-1)
        if share is not None and tq == tk:
            share[i:i + step] = (e[:, :, p:, 0] / total[:, :, p:]).mean((1, 2)) * tk
        if masked:
            shifted.clamp_min_(torch.finfo(s.dtype).min)  # 0 · (−inf) would be NaN; 0 · min is 0
        # Σ e·(s − m), summed in place in e (read for the share above): a third fewer passes over the scores
        entropy[i:i + step] = (total.log() - e.mul_(shifted).sum(-1) / total).mean((1, 2))
    entropy /= math.log(tk)
    return entropy, share


def _device(scores: AttentionScores) -> torch.device:
    held = scores.logits if scores.logits is not None else scores.q
    assert held is not None  # q is set whenever logits are not
    return held.device


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
