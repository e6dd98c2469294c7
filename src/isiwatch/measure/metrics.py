"""Per-layer metrics of a ViT block (token change, attention entropy, ISI, token similarity, block influence,
[CLS] share and alignment, norm friction), computed from the block's tensors.

A block is reduced while its tensors are alive (`reduce_block`: a few whole-batch matmuls into a per-token
table of dot products, `BlockSums`); the formulas run once for all blocks at the end of the pass (`block_curves`),
so the number of ops of a sample grows neither with the images nor with the depth's formulas. Every curve holds one
value per image before averaging; all inputs are fp32. ``p`` is the number of prefix tokens ([CLS] first).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ..taps import AttentionScores, BlockTensors
from .readback import on_device

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


def _squared_norm(t: Tensor) -> Tensor:
    """‖t‖² along the last dimension: one reduction that writes no elementwise temporary."""
    squared: Tensor = torch.linalg.vector_norm(t, dim=-1).square()
    return squared


def _norm(squared: Tensor) -> Tensor:
    """max(‖t‖, EPS) from ‖t‖², as ``F.normalize`` divides by it."""
    return squared.sqrt().clamp_min(EPS)


def attention_rows(scores: AttentionScores) -> tuple[Tensor, Tensor]:
    """(entropy, first) of each query row of a block's attention averaged over its heads, (B,Tq) each: what
    `attention_curves` needs, kept per block until the formulas run for all blocks at once."""
    rows = scores.row_stats()
    return rows.entropy.mean(1), rows.first.mean(1)


def attention_curves(entropy: Tensor, first: Tensor, keys: int, p: int, has_cls: bool) -> tuple[Tensor, Tensor | None]:
    """(attn_entropy, cls_attention_share) per image from `attention_rows` (…,Tq) of attentions over ``keys``
    keys.

    The entropy is averaged over heads and query rows and normalised by ln Tk (0 = one source, 1 = uniform); masked
    (−inf) scores carry no probability and add nothing. The [CLS] share is Tk · mean attention that patch queries
    pay to [CLS] (1 = uniform); NaN where patches do not query (CaiT's class attention).
    """
    mean_entropy = entropy.mean(-1) / math.log(keys)
    share = None
    if has_cls:
        share = first[..., p:].mean(-1) * keys if first.shape[-1] == keys else torch.full_like(mean_entropy, math.nan)
    return mean_entropy, share


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


def cls_patch_cos(z: Tensor, p: int) -> Tensor:
    """Mean cos([CLS], patch_i)."""
    squared = _squared_norm(z)
    dots: Tensor = torch.linalg.vecdot(z[:, p:], z[:, :1])  # [CLS] broadcast over the patches
    return (dots / _norm(squared[:, p:])).mean(-1) / _norm(squared[:, 0])


def norm_friction(x: Tensor, x_normed: Tensor, p: int) -> Tensor:
    """cls_patch_cos before minus after norm1: how much the norm layer separates [CLS] from patches."""
    return cls_patch_cos(x, p) - cls_patch_cos(x_normed, p)


#: Bytes the stacked token tensors of one block (five (b,T,D) fp32 copies) may take at once: the images per pass of
#: `reduce_block` follow from it, so the number of passes is set by memory (one for most probe batches).
TOKEN_BYTES = 1 << 29

#: The tensors `reduce_block` stacks per token, in this order: X, norm1(X), Z, the branch, Z − centre.
_KINDS = 5
#: Columns of the per-token table, picked from the 5×5 token Gram (``5i + j``) and the 5×5 products with the
#: image's [CLS] kinds (``25 + 5i + j``): ‖X‖², ‖norm1 X‖², ‖Z‖²; X·X_cls, norm1(X)·norm1(X)_cls, Z·Z_cls;
#: ‖branch‖², ‖Z − centre‖², X·branch, X·Z.
TABLE_COLUMNS = (0, 6, 12, 25, 31, 37, 18, 24, 3, 2)


@dataclass
class BlockSums:
    """One block reduced to what its metrics need, on the model's device.

    ``tokens``: (B,T,10) per-token dot products (`TABLE_COLUMNS`); ``total``: (B,1,D) Σᵢ uᵢ of the normalised
    centred patch tokens (``token_similarity`` reads ‖Σᵢ uᵢ‖²); ``entropy``/``first``: (B,Tq) from the attention
    (`attention_rows`) over ``keys`` keys; ``p``/``has_cls``: the block's prefix tokens and whether the first is a
    [CLS].
    """

    tokens: Tensor
    total: Tensor
    entropy: Tensor
    first: Tensor
    keys: int
    p: int
    has_cls: bool

    @property
    def layout(self) -> tuple[object, ...]:
        """What blocks computed together must share: table and attention shapes, keys, prefix and [CLS]."""
        return self.tokens.shape, self.entropy.shape, self.keys, self.p, self.has_cls

    @classmethod
    def joined(cls, chunks: list[BlockSums]) -> BlockSums:
        """The sums of several probe chunks of the same block, images concatenated."""
        if len(chunks) == 1:
            return chunks[0]
        first = chunks[0]
        return cls(torch.cat([c.tokens for c in chunks]), torch.cat([c.total for c in chunks]),
                   torch.cat([c.entropy for c in chunks]), torch.cat([c.first for c in chunks]), first.keys, first.p,
                   first.has_cls)


def _token_table(x: Tensor, x_normed: Tensor, z: Tensor, branch: Tensor, v: Tensor, columns: Tensor) -> Tensor:
    """The (b,T,10) per-token table of a pass: the five kinds side by side, one batched Gram per token and one
    product of every token with its image's first token."""
    b, t, d = x.shape
    stacked = torch.cat([x, x_normed, z, branch, v], -1)
    per_token = stacked.view(b * t, _KINDS, d)
    gram = torch.bmm(per_token, per_token.transpose(1, 2))
    per_image = stacked.view(b, t * _KINDS, d)
    with_first = torch.bmm(per_image, per_image[:, :_KINDS].transpose(1, 2))
    return torch.cat([gram.view(b, t, _KINDS ** 2), with_first.view(b, t, _KINDS ** 2)], -1).index_select(-1, columns)


def reduce_block(bt: BlockTensors) -> tuple[BlockSums, Tensor]:
    """A block's `BlockSums` and its mean patch token per image (B,D), the probes' feature.

    The centred tokens v = Z − centre (centre: the mean patch token of the batch) are formed, never expanded as
    ‖Z‖² − 2 Z·centre + ‖centre‖², which loses all precision when tokens collapse onto the centre, the case
    ``token_similarity`` exists to see.
    """
    p, z = bt.p, bt.z
    patch_mean = z[:, p:].mean(1)
    v = z - patch_mean.mean(0)
    b, t, d = z.shape
    step = max(1, TOKEN_BYTES // (4 * _KINDS * t * d))
    columns = on_device(TABLE_COLUMNS, z.device, torch.long)
    if step >= b:
        tokens = _token_table(bt.x, bt.x_normed, z, bt.branch, v, columns)
    else:
        tokens = torch.cat([_token_table(bt.x[i:i + step], bt.x_normed[i:i + step], z[i:i + step],
                                         bt.branch[i:i + step], v[i:i + step], columns) for i in range(0, b, step)])
    weights = tokens[:, p:, 7].clamp_min(EPS * EPS).rsqrt()  # 1 / max(‖v‖, EPS), as F.normalize divides
    total = torch.bmm(weights.unsqueeze(1), v[:, p:])  # Σ uᵢ, (B,1,D)
    return BlockSums(tokens, total, *attention_rows(bt.attention), bt.attention.shape[-1], p, bt.has_cls), patch_mean


def block_curves(blocks: list[BlockSums]) -> dict[str, Tensor]:
    """Per-block means over the images of every block metric (``isi`` is formed from them), (L,) each; the
    [CLS] metrics are NaN on blocks without a [CLS]. Blocks of one shape are computed together (one group for
    most families; CaiT's class-attention blocks are a second)."""
    groups: list[list[BlockSums]] = []
    for block in blocks:
        if groups and groups[-1][0].layout == block.layout:
            groups[-1].append(block)
        else:
            groups.append([block])
    parts = [_group_curves(group) for group in groups]
    return {name: torch.cat([part[name] for part in parts]) for name in parts[0]}


def _group_curves(group: list[BlockSums]) -> dict[str, Tensor]:
    """`block_curves` of blocks whose tables have one shape, prefix and [CLS]: (L,B) formulas, then image means."""
    first = group[0]
    p = first.p
    tokens = torch.stack([b.tokens for b in group])  # (L,B,T,10)
    norms = tokens[..., :3].sqrt().clamp_min(EPS)  # ‖X‖, ‖norm1 X‖, ‖Z‖ (max with EPS, as F.normalize)
    xx, bb, vv, xb, xz = tokens.unbind(-1)[0], *tokens[..., 6:].unbind(-1)
    nx, nz = norms[..., 0], norms[..., 2]
    ny = (xx + 2 * xb + bb).clamp_min(0).sqrt().clamp_min(EPS)  # ‖X + branch‖: Y is never formed
    n = tokens.shape[2] - p
    patches = vv[..., p:]
    total = torch.stack([b.total for b in group])  # (L,B,1,D)
    similarity = (total * total).sum((-2, -1)) - (patches / patches.clamp_min(EPS * EPS)).sum(-1)
    entropy, share = attention_curves(torch.stack([b.entropy for b in group]), torch.stack([b.first for b in group]),
                                      first.keys, p, first.has_cls)
    out = {"attn_token_change": 1.0 - ((xx + xb) / (nx * ny)).mean(-1),
           "attn_entropy": entropy,
           "token_similarity": similarity / (n * (n - 1)),
           "block_influence": 1.0 - (xz / (nx * nz)).mean(-1)}
    if first.has_cls:
        cos = (tokens[..., p:, 3:6] / norms[..., p:, :]).mean(-2) / norms[..., 0, :]  # X, norm1 X, Z: (L,B,3)
        assert share is not None  # attention_curves gives a share wherever there is a [CLS]
        out["cls_attention_share"] = share
        out["cls_patch_cos"] = cos[..., 2]
        out["norm_friction"] = cos[..., 0] - cos[..., 1]
    means = {name: values.mean(-1) for name, values in out.items()}
    if not first.has_cls:
        nan = torch.full((len(group),), math.nan, device=tokens.device)
        means.update({name: nan for name in ("cls_attention_share", "cls_patch_cos", "norm_friction")})
    return means
