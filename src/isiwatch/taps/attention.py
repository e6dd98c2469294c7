"""Attention statistics exactly as the model attends, recorded while its attention modules run.

Families compute q and k differently (rotary embeddings applied inside EVA's forward, relative position
biases in BEiT and the relpos ViTs, grouped k/v heads, talking heads in CaiT), so the tap does not rebuild
q/k from module outputs. Instead `AttentionRecorder`, a ``TorchFunctionMode`` switched on only
inside a block's attention modules, takes the arguments of ``F.scaled_dot_product_attention`` (q, k, v, mask,
scale) or, on unfused paths, the input of the softmax over keys. A plain call (no mask, not causal, no dropout,
as many k/v heads as q heads: most families' eval pass; a relative position bias arrives as a mask) is answered
by the recorder itself: it forms the scores once, chunk by chunk, and the same
exponentials give both the output (equal to the fused kernel's to rounding) and the per-row entropy and [CLS]
weight, so the probe pass pays for attention once, not twice. Other calls run the model's own kernel and keep an
fp32 copy of q and k, from which the scores are rebuilt chunk by chunk. Either way the (B,H,Tq,Tk) scores are never
held for the whole batch at once, and the mode costs one Python dispatch per torch call inside the attention
modules during the probe pass (none elsewhere, none outside it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

_SOFTMAX = (F.softmax, torch.softmax, Tensor.softmax)

#: Attention scores handled per chunk of images (elements), so the softmax passes stay in cache.
SCORE_CHUNK = 1 << 19


@dataclass
class AttentionRows:
    """Softmax statistics of each query row of one block's attention, (B,H,Tq) fp32 each: ``entropy`` in nats
    (masked keys add nothing) and ``first``, the weight on key 0 ([CLS] where there is one); ``keys``: Tk."""

    entropy: Tensor
    first: Tensor
    keys: int


def _softmax_rows(s: Tensor, formed: bool, masked: bool, values: Tensor | None = None,
                  out: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(entropy, first) of scores ``s`` (b,H,Tq,Tk) fp32; ``formed``: ``s`` was formed for this call and may be
    overwritten; ``values`` (b,H,Tk,hd): also write softmax(s) @ values into ``out`` (b,H,Tq,hd) fp32.

    With m the row maximum and e = exp(s − m), the softmax row is e / Σe and its entropy is
    ``ln Σe − Σ e·(s − m) / Σe``: one exponential per score, and no copy of the scores beyond e; the output is
    (e @ v) / Σe, so the probabilities are never formed.
    """
    peak = s.amax(-1, keepdim=True)
    shifted = s.sub_(peak) if formed else s - peak
    e = shifted.exp()
    total = e.sum(-1)
    first = e[..., 0] / total
    if values is not None:
        torch.matmul(e, values, out=out).div_(total.unsqueeze(-1))
    if masked:
        shifted.clamp_min_(torch.finfo(s.dtype).min)  # 0 · (−inf) would be NaN; 0 · min is 0
    # Σ e·(s − m), summed in place in e (read above): a third fewer passes over the scores
    entropy = total.log() - e.mul_(shifted).sum(-1) / total
    return entropy, first


def _chunk(shape: tuple[int, int, int, int]) -> int:
    """Images per chunk of scores of ``shape`` (B,H,Tq,Tk)."""
    _, h, tq, tk = shape
    return max(1, SCORE_CHUNK // (h * tq * tk))


@dataclass
class AttentionScores:
    """Pre-softmax attention scores of one block: ``q·kᵀ·scale + bias``, the model's own ``logits``, or only
    their row statistics ``rows`` when the recorder attended itself.

    ``q``: (B,H,Tq,hd), ``k``: (B,H,Tk,hd) with grouped heads already repeated; ``bias``: additive,
    broadcastable to (B,H,Tq,Tk), −inf where a key is masked; ``logits``: (B,H,Tq,Tk) when the model formed
    the scores itself (unfused paths), in which case q/k are None.
    """

    q: Tensor | None = None
    k: Tensor | None = None
    scale: float = 1.0
    bias: Tensor | None = None
    logits: Tensor | None = None
    rows: AttentionRows | None = None

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(B, H, Tq, Tk)."""
        if self.rows is not None:
            b, h, tq = self.rows.entropy.shape
            return b, h, tq, self.rows.keys
        if self.logits is not None:
            return cast(tuple[int, int, int, int], tuple(self.logits.shape))  # logits are 4-D
        assert self.q is not None and self.k is not None  # q/k are None only when logits are set
        b, h, tq, _ = self.q.shape
        return b, h, tq, self.k.shape[-2]

    @property
    def masked(self) -> bool:
        """Whether some scores may be −inf: a mask or causal bias is present, or the model formed the scores itself
        (its own mask may be in them). Read from the structure, not the values: no host–device sync per block."""
        return self.bias is not None or self.logits is not None

    def scores(self, start: int, stop: int) -> Tensor:
        """Scores of images [start, stop), (b,H,Tq,Tk) fp32."""
        if self.logits is not None:
            return self.logits[start:stop]
        assert self.q is not None and self.k is not None  # q/k are None only when logits are set
        s = torch.matmul(self.q[start:stop], self.k[start:stop].transpose(-2, -1)).mul_(self.scale)
        if self.bias is not None:
            bias = self.bias
            if bias.dim() == 4 and bias.shape[0] == self.q.shape[0] and bias.shape[0] > 1:
                bias = bias[start:stop]
            s = s + bias
        return s

    def row_stats(self) -> AttentionRows:
        """Per-row softmax entropy and weight on key 0 (`AttentionRows`), formed chunk by chunk (the
        shift is made in place in scores formed for a chunk, never in the model's own logits)."""
        if self.rows is not None:
            return self.rows
        b, _, _, tk = self.shape
        step = _chunk(self.shape)
        parts = [_softmax_rows(self.scores(i, i + step), self.logits is None, self.masked) for i in range(0, b, step)]
        return AttentionRows(torch.cat([e for e, _ in parts]), torch.cat([f for _, f in parts]), tk)

    @classmethod
    def along_heads(cls, records: list[AttentionScores]) -> AttentionScores:
        """One set of statistics from several attentions over the same tokens (parallel blocks, differential
        attention): their heads side by side."""
        if len(records) == 1:
            return records[0]
        rows = [r.row_stats() for r in records]
        return cls(rows=AttentionRows(torch.cat([r.entropy for r in rows], 1), torch.cat([r.first for r in rows], 1),
                                      rows[0].keys))


def _from_sdpa(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
               dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
               enable_gqa: bool = False) -> AttentionScores:
    q, k = query.float(), key.float()
    if k.shape[-3] != q.shape[-3]:  # grouped-query attention: each k/v head serves several q heads
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    bias = None
    if attn_mask is not None:
        bias = (torch.zeros(attn_mask.shape, device=q.device).masked_fill_(~attn_mask, -math.inf)
                if attn_mask.dtype == torch.bool else attn_mask.float())
    if is_causal:
        tq, tk = q.shape[-2], k.shape[-2]
        causal = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril()
        causal_bias = torch.zeros(tq, tk, device=q.device).masked_fill_(~causal, -math.inf)
        bias = causal_bias if bias is None else bias + causal_bias
    return AttentionScores(q, k, q.shape[-1] ** -0.5 if scale is None else float(scale), bias)


def _plain(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
           is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> bool:
    """Whether the recorder can answer this ``scaled_dot_product_attention`` call itself: 4-D, no mask, not
    causal, no dropout, as many k/v heads as q heads."""
    return (attn_mask is None and not is_causal and dropout_p == 0.0 and not enable_gqa and query.dim() == 4
            and key.shape[-3] == query.shape[-3] == value.shape[-3])


def _attend(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
            is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False
            ) -> tuple[Tensor, AttentionScores]:
    """A plain (`_plain`) attention computed in fp32 chunk by chunk: its output, in the query's dtype, and
    its row statistics."""
    q, k, v = query.float(), key.float(), value.float()
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    b, h, tq, _ = q.shape
    out = torch.empty(*q.shape[:-1], v.shape[-1], device=q.device)
    entropy = torch.empty(b, h, tq, device=q.device)
    first = torch.empty_like(entropy)
    step = _chunk((b, h, tq, k.shape[-2]))
    for i in range(0, b, step):
        s = torch.matmul(q[i:i + step], k[i:i + step].transpose(-2, -1)).mul_(scale)
        entropy[i:i + step], first[i:i + step] = _softmax_rows(s, True, False, v[i:i + step], out[i:i + step])
    return out.to(query.dtype), AttentionScores(rows=AttentionRows(entropy, first, k.shape[-2]))


def _softmax_over_keys(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    x = args[0]
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    if isinstance(x, Tensor) and x.dim() == 4 and dim in (-1, 3):
        return x
    return None


class AttentionRecorder(TorchFunctionMode):
    """Records `AttentionScores` while `active`: answers plain attention calls itself (see the module
    docstring) and passes every other call through unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self.active = False
        self.records: list[AttentionScores] = []

    def __torch_function__(self, func: Callable[..., Any], types: Collection[type], args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if self.active:
            if func is F.scaled_dot_product_attention:
                if _plain(*args, **kwargs):
                    out, record = _attend(*args, **kwargs)
                    self.records.append(record)
                    return out
                self.records.append(_from_sdpa(*args, **kwargs))
            elif func in _SOFTMAX and (logits := _softmax_over_keys(args, kwargs)) is not None:
                self.records.append(AttentionScores(logits=logits.float()))
        return func(*args, **kwargs)
