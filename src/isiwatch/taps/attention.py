"""Attention scores exactly as the model computes them, recorded while its attention modules run.

Families compute q and k differently (rotary embeddings applied inside EVA's forward, relative position
biases in BEiT and the relpos ViTs, grouped k/v heads, talking heads in CaiT), so the tap does not rebuild
q/k from module outputs. Instead :class:`AttentionRecorder`, a ``TorchFunctionMode`` switched on only
inside a block's attention modules, records the arguments of ``F.scaled_dot_product_attention`` (q, k,
mask, scale: the fused path the model keeps using) or, on unfused paths, the input of the softmax over
keys. Nothing is changed: the model's own kernel computes the output. The mode is pushed when an attention
module starts and popped when it ends, so the cost is one Python dispatch per torch call inside the attention
modules during the probe pass (none elsewhere, none outside it) and one fp32 copy of q and k per block;
the (B,H,Tq,Tk) scores are rebuilt chunk by chunk by the metrics, never for the whole batch at once.
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


@dataclass
class AttentionScores:
    """Pre-softmax attention scores of one block: ``q·kᵀ·scale + bias`` or the model's own ``logits``.

    ``q``: (B,H,Tq,hd), ``k``: (B,H,Tk,hd) with grouped heads already repeated; ``bias``: additive,
    broadcastable to (B,H,Tq,Tk), −inf where a key is masked; ``logits``: (B,H,Tq,Tk) when the model formed
    the scores itself (unfused paths), in which case q/k are None.
    """

    q: Tensor | None = None
    k: Tensor | None = None
    scale: float = 1.0
    bias: Tensor | None = None
    logits: Tensor | None = None

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(B, H, Tq, Tk)."""
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

    @classmethod
    def along_heads(cls, records: list[AttentionScores]) -> AttentionScores:
        """One set of scores from several attentions over the same tokens (parallel blocks): their heads side
        by side."""
        if len(records) == 1:
            return records[0]
        b = records[0].shape[0]
        return cls(logits=torch.cat([r.scores(0, b) for r in records], dim=1))


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


def _softmax_over_keys(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    x = args[0]
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    if isinstance(x, Tensor) and x.dim() == 4 and dim in (-1, 3):
        return x
    return None


class AttentionRecorder(TorchFunctionMode):
    """Records :class:`AttentionScores` while :attr:`active`; passes every call through unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self.active = False
        self.records: list[AttentionScores] = []

    def __torch_function__(self, func: Callable[..., Any], types: Collection[type], args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if self.active:
            if func is F.scaled_dot_product_attention:
                self.records.append(_from_sdpa(*args, **kwargs))
            elif func in _SOFTMAX and (logits := _softmax_over_keys(args, kwargs)) is not None:
                self.records.append(AttentionScores(logits=logits.float()))
        return func(*args, **kwargs)
