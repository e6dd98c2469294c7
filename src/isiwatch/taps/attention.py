"""Attention statistics exactly as the model attends, recorded while its attention modules run.

Families compute q and k differently (rotary embeddings applied inside EVA's forward, relative position
biases in BEiT and the relpos ViTs, grouped k/v heads, talking heads in CaiT), so the tap does not rebuild
q/k from module outputs. Instead `AttentionRecorder`, a ``TorchFunctionMode`` switched on only
inside a block's attention modules, takes the arguments of ``F.scaled_dot_product_attention`` (q, k, v, mask,
scale) or, on unfused paths, the input of the softmax over keys. The model's own call always runs unchanged, so
its output is what it is without the Watch.

A call without a mask, causality or dropout (most families' eval pass) gets its statistics from one more fused
attention call on the same device, with the keys as values and the log-sum-exp returned: with s = scale·q·kᵀ and
P = softmax(s), each row's entropy is ``lse − scale·⟨q, P·K⟩`` and its weight on key 0 is ``exp(s₀ − lse)``, so no
(B,H,Tq,Tk) matrix is formed. Other calls keep an fp32 copy of q and k (or the model's own logits), from which the
scores are rebuilt in as few passes as `SCORE_BYTES` allows.
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

#: Bytes of fp32 attention scores one rebuilt pass may hold: the images per pass follow from it, so the number of
#: passes is set by memory, not by the number of images (one pass for most probe batches).
SCORE_BYTES = 1 << 29


@dataclass
class AttentionRows:
    """Softmax statistics of each query row of one block's attention, (B,H,Tq) fp32 each: ``entropy`` in nats
    (masked keys add nothing) and ``first``, the weight on key 0 ([CLS] where there is one); ``keys``: Tk."""

    entropy: Tensor
    first: Tensor
    keys: int


def _softmax_rows(s: Tensor, formed: bool, masked: bool) -> tuple[Tensor, Tensor]:
    """(entropy, first) of scores ``s`` (b,H,Tq,Tk) fp32; ``formed``: ``s`` was formed for this call and may be
    overwritten.

    With m the row maximum and e = exp(s − m), the softmax row is e / Σe and its entropy is
    ``ln Σe − Σ e·(s − m) / Σe``: one exponential per score, and no copy of the scores beyond e.
    """
    peak = s.amax(-1, keepdim=True)
    shifted = s.sub_(peak) if formed else s - peak
    e = shifted.exp()
    total = e.sum(-1)
    first = e[..., 0] / total
    if masked:
        shifted.clamp_min_(torch.finfo(s.dtype).min)  # 0 · (−inf) would be NaN; 0 · min is 0
    entropy = total.log() - e.mul_(shifted).sum(-1) / total
    return entropy, first


def _images_per_pass(shape: tuple[int, int, int, int]) -> int:
    """Images per rebuilt pass over scores of ``shape`` (B,H,Tq,Tk): as many as `SCORE_BYTES` holds."""
    _, h, tq, tk = shape
    return max(1, SCORE_BYTES // (4 * h * tq * tk))


def _keys_as_values(q: Tensor, k: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """(softmax(s)·k (B,H,Tq,hd), log-sum-exp of each row of s (B,H,Tq)) for s = scale·q·kᵀ, from the device's
    fused attention kernel (the math where the device has none that returns the log-sum-exp)."""
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, k, 0.0, False, scale=scale)[:2]
        return out, lse
    if q.device.type == "cuda":  # the memory-efficient kernel pads the log-sum-exp to a multiple of 32 rows
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, k, None, True, 0.0, False,
                                                                          scale=scale)[:2]
        return out, lse[..., :q.shape[-2]]
    s = torch.matmul(q, k.transpose(-2, -1)).mul_(scale)
    return torch.matmul(s.softmax(-1), k), s.logsumexp(-1)


def fused_rows(q: Tensor, k: Tensor, scale: float) -> AttentionRows:
    """`AttentionRows` of an unmasked attention from one fused call with the keys as values (module docstring):
    a number of ops that does not depend on the images, heads or tokens."""
    q, k = q.float(), k.float()
    mean_key, lse = _keys_as_values(q, k, scale)
    entropy = torch.sub(lse, torch.linalg.vecdot(q, mean_key), alpha=scale)
    first = torch.exp(scale * torch.linalg.vecdot(q, k[..., :1, :]) - lse)
    return AttentionRows(entropy, first, k.shape[-2])


@dataclass
class AttentionScores:
    """Pre-softmax attention scores of one block: ``q·kᵀ·scale + bias``, the model's own ``logits``, or only
    their row statistics ``rows`` (from `fused_rows`).

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
        """Per-row softmax entropy and weight on key 0 (`AttentionRows`), rebuilt in as few passes as `SCORE_BYTES`
        allows (the shift is made in place in scores formed for a pass, never in the model's own logits)."""
        if self.rows is not None:
            return self.rows
        b, _, _, tk = self.shape
        step = _images_per_pass(self.shape)
        if step >= b:
            return AttentionRows(*_softmax_rows(self.scores(0, b), self.logits is None, self.masked), tk)
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


def _repeated_keys(query: Tensor, key: Tensor) -> Tensor:
    """``key`` with grouped k/v heads repeated to the query's heads (grouped-query attention)."""
    if key.shape[-3] != query.shape[-3]:
        return key.repeat_interleave(query.shape[-3] // key.shape[-3], dim=-3)
    return key


def _from_sdpa(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
               dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
               enable_gqa: bool = False) -> AttentionScores:
    """The record of one ``scaled_dot_product_attention`` call: fused row statistics when it has no mask, no
    causality and no dropout, else fp32 q/k and the additive bias the scores are rebuilt from."""
    q = query.float()
    k = _repeated_keys(q, key.float())
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if attn_mask is None and not is_causal and dropout_p == 0.0 and q.dim() == 4:
        return AttentionScores(rows=fused_rows(q, k, scale))
    bias = None
    if attn_mask is not None:
        bias = (torch.zeros(attn_mask.shape, device=q.device).masked_fill_(~attn_mask, -math.inf)
                if attn_mask.dtype == torch.bool else attn_mask.float())
    if is_causal:
        tq, tk = q.shape[-2], k.shape[-2]
        causal = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril()
        causal_bias = torch.zeros(tq, tk, device=q.device).masked_fill_(~causal, -math.inf)
        bias = causal_bias if bias is None else bias + causal_bias
    return AttentionScores(q, k, scale, bias)


def _softmax_over_keys(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    x = args[0]
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    if isinstance(x, Tensor) and x.dim() == 4 and dim in (-1, 3):
        return x
    return None


class AttentionRecorder(TorchFunctionMode):
    """Records `AttentionScores` while `active` and passes every call through unchanged (see the module
    docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.active = False
        self.records: list[AttentionScores] = []

    def __torch_function__(self, func: Callable[..., Any], types: Collection[type], args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if self.active:
            if func is F.scaled_dot_product_attention:
                query = args[0] if args else kwargs["query"]
                with torch.autocast(query.device.type, enabled=False):  # statistics in float32 under autocast too
                    self.records.append(_from_sdpa(*args, **kwargs))
            elif func in _SOFTMAX and (logits := _softmax_over_keys(args, kwargs)) is not None:
                self.records.append(AttentionScores(logits=logits.float()))
        return func(*args, **kwargs)
