"""Per-layer metrics of a ViT block (token change, attention entropy, ISI, token similarity, block influence,
[CLS] share and alignment, norm friction), computed from the block's tensors.

A block is reduced while its tensors are alive (`reduce_block`: whole-batch norms and products into a per-token
table, `BlockSums`); the formulas run once for all blocks at the end of the pass (`block_curves`),
so the number of ops of a sample grows neither with the images nor with the depth's formulas. Every curve holds one
value per image before averaging; all inputs are fp32. ``p`` is the number of prefix tokens ([CLS] first).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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


@dataclass
class BlockSums:
    """One block reduced to what its metrics need, on the model's device.

    ``tokens``: (B,T,10) per token, in order: ‖X‖, ‖norm1 X‖, ‖Z‖; X·X_cls, norm1(X)·norm1(X)_cls, Z·Z_cls (with
    its image's first token); ‖branch‖, ‖Z − centre‖, X·branch, X·Z; ``total``: (B,1,D) Σᵢ uᵢ of the normalised
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


def _norm_column(t: Tensor) -> Tensor:
    """‖t‖ per token, (B,T,1): one reduction, no temporary."""
    norm: Tensor = torch.linalg.vector_norm(t, dim=-1, keepdim=True)
    return norm


def _first_column(t: Tensor) -> Tensor:
    """Each token's dot product with its image's first token, (B,T,1): one matrix–vector product per image."""
    return torch.bmm(t, t[:, :1].transpose(1, 2))


def _dot_column(a: Tensor, b: Tensor) -> Tensor:
    """a·b per token, (B,T,1): a batch of 1×D by D×1 products, no (B,T,D) temporary."""
    bt, d = a.shape[0] * a.shape[1], a.shape[2]
    return torch.bmm(a.reshape(bt, 1, d), b.reshape(bt, d, 1)).view(*a.shape[:2], 1)


def reduce_block(bt: BlockTensors) -> tuple[BlockSums, Tensor]:
    """A block's `BlockSums` and its mean patch token per image (B,D), the probes' feature.

    The per-token table (`BlockSums.tokens`) is read from the block's tensors in place: norms, products with the
    first token and two products per token, each one pass over its inputs, so the only (B,T,D) tensor a block adds
    is the centred tokens v = Z − centre (centre: the mean patch token of the batch). They are formed, never
    expanded as ‖Z‖² − 2 Z·centre + ‖centre‖², which loses all precision when tokens collapse onto the centre, the
    case ``token_similarity`` exists to see.
    """
    p, x, z = bt.p, bt.x, bt.z
    patch_mean = z[:, p:].mean(1)
    v = z - patch_mean.mean(0)
    tokens = torch.cat([_norm_column(x), _norm_column(bt.x_normed), _norm_column(z), _first_column(x),
                        _first_column(bt.x_normed), _first_column(z), _norm_column(bt.branch), _norm_column(v),
                        _dot_column(x, bt.branch), _dot_column(x, z)], -1)
    weights = tokens[:, p:, 7].clamp_min(EPS).reciprocal()  # 1 / max(‖v‖, EPS), as F.normalize divides
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
    norms = tokens[..., :3].clamp_min(EPS)  # ‖X‖, ‖norm1 X‖, ‖Z‖ (max with EPS, as F.normalize)
    x_norm, b_norm, v_norm, xb, xz = tokens.unbind(-1)[0], *tokens[..., 6:].unbind(-1)
    nx, nz = norms[..., 0], norms[..., 2]
    xx = x_norm.square()
    y_squared = torch.add(torch.addcmul(xx, b_norm, b_norm), xb, alpha=2)  # ‖X + branch‖²: Y is never formed
    ny = y_squared.clamp_min(0).sqrt().clamp_min(EPS)
    n = tokens.shape[2] - p
    unit = v_norm[..., p:] / v_norm[..., p:].clamp_min(EPS)  # ‖uᵢ‖: 1, or 0 for a token at the centre
    total = torch.stack([b.total for b in group])  # (L,B,1,D)
    similarity = (total * total).sum((-2, -1)) - (unit * unit).sum(-1)
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
