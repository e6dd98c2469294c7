"""Token-specialised layers: prefix tokens ([CLS], distillation, registers) get their own parameters.

Each layer routes the first ``num_prefix_tokens`` tokens of a (B, T, D) sequence through prefix
parameters and the remaining patch tokens through the layer's original (shared) ones, so one block
holds two parameter sets but attention still mixes all tokens together and the FLOPs of the
projections do not change. The original parameters keep their names and objects (``norm1.weight``,
``attn.qkv.weight``), so a specialised state dict is a plain timm state dict plus ``prefix_*`` entries,
and the prefix parameters start as copies of the shared ones: the converted layer computes exactly the
same function until training moves them apart.

LayerNorm statistics (mean, variance) are per token over the channels, so every token already has its
own statistics path; what the patch and prefix paths can additionally own is the affine part.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from timm.layers import LayerNorm as TimmLayerNorm  # type: ignore[attr-defined]  # timm re-exports without __all__ or "as"
from timm.layers import LayerScale  # type: ignore[attr-defined]  # same
from torch import Tensor, nn

#: Norm classes whose forward is exactly ``F.layer_norm`` (timm's fast-norm path left aside), so that
#: the split layer reproduces them bit for bit.
SPLITTABLE_NORMS = (nn.LayerNorm, TimmLayerNorm)


class PrefixSplit(nn.Module):
    """Base of the token-specialised layers: ``forward_prefix`` on tokens [0, P), ``forward_patches`` on
    the rest, concatenated back along the token axis."""

    num_prefix_tokens: int

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() != 3:
            raise ValueError(f"{type(self).__name__} expects (B, T, D) token sequences, got shape {tuple(x.shape)}")
        p = self.num_prefix_tokens
        return torch.cat([self.forward_prefix(x[:, :p]), self.forward_patches(x[:, p:])], dim=1)

    def forward_prefix(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def forward_patches(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, num_prefix_tokens={self.num_prefix_tokens}"


def _copy(param: Tensor) -> nn.Parameter:
    return nn.Parameter(param.detach().clone())


class TokenLayerNorm(PrefixSplit, nn.LayerNorm):
    """LayerNorm with its own affine parameters (``prefix_weight``, ``prefix_bias``) for prefix tokens."""

    prefix_weight: nn.Parameter
    prefix_bias: nn.Parameter | None

    @classmethod
    def from_norm(cls, norm: nn.LayerNorm, num_prefix_tokens: int) -> TokenLayerNorm:
        """Wrap ``norm``'s parameters (shared by reference) and add prefix copies of them."""
        if type(norm) not in SPLITTABLE_NORMS:
            raise ValueError(f"cannot specialise {type(norm).__name__}: only LayerNorm norms are supported")
        if norm.weight is None:
            raise ValueError("cannot specialise a LayerNorm without affine parameters")
        layer = cls(norm.normalized_shape, eps=norm.eps, bias=norm.bias is not None, device="meta")
        layer.num_prefix_tokens = num_prefix_tokens
        layer.weight, layer.bias = norm.weight, norm.bias
        layer.prefix_weight = _copy(norm.weight)
        layer.register_parameter("prefix_bias", None if norm.bias is None else _copy(norm.bias))
        return layer

    def forward_prefix(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.prefix_weight, self.prefix_bias, self.eps)

    def forward_patches(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class TokenLayerScale(PrefixSplit, LayerScale):
    """timm LayerScale with its own per-channel scale ``prefix_gamma`` for prefix tokens."""

    prefix_gamma: nn.Parameter

    @classmethod
    def from_layer_scale(cls, scale: LayerScale, num_prefix_tokens: int) -> TokenLayerScale:
        layer = cls(scale.gamma.numel(), init_values=scale.init_values, device="meta")
        layer.num_prefix_tokens = num_prefix_tokens
        layer.gamma = scale.gamma
        layer.prefix_gamma = _copy(scale.gamma)
        return layer

    def forward_prefix(self, x: Tensor) -> Tensor:
        return x * self.prefix_gamma

    def forward_patches(self, x: Tensor) -> Tensor:
        return x * self.gamma


class TokenLinear(PrefixSplit, nn.Linear):
    """Linear layer (the QKV projection) with its own projection for prefix tokens.

    ``lora_rank=None``: a full copy, ``prefix_weight`` (+ ``prefix_bias``). ``lora_rank=r``: the shared
    weight plus a rank-r update ``prefix_lora_b @ prefix_lora_a`` (B starts at zero, A Kaiming-uniform as
    in LoRA; scale 1), sharing the bias. At conversion both forms equal the shared projection.
    """

    lora_rank: int | None
    prefix_weight: nn.Parameter
    prefix_bias: nn.Parameter | None
    prefix_lora_a: nn.Parameter
    prefix_lora_b: nn.Parameter

    @classmethod
    def from_linear(cls, linear: nn.Linear, num_prefix_tokens: int, lora_rank: int | None = None) -> TokenLinear:
        if type(linear) is not nn.Linear:
            raise ValueError(f"cannot specialise {type(linear).__name__}: only nn.Linear projections are supported")
        out_features, in_features = linear.weight.shape
        if lora_rank is not None and not 1 <= lora_rank <= min(in_features, out_features):
            raise ValueError(f"lora_rank must be in [1, {min(in_features, out_features)}], got {lora_rank}")
        layer = cls(in_features, out_features, bias=linear.bias is not None, device="meta")
        layer.num_prefix_tokens, layer.lora_rank = num_prefix_tokens, lora_rank
        layer.weight, layer.bias = linear.weight, linear.bias
        if lora_rank is None:
            layer.prefix_weight = _copy(linear.weight)
            layer.register_parameter("prefix_bias", None if linear.bias is None else _copy(linear.bias))
        else:
            device, dtype = linear.weight.device, linear.weight.dtype
            layer.prefix_lora_a = nn.Parameter(torch.empty(lora_rank, in_features, device=device, dtype=dtype))
            nn.init.kaiming_uniform_(layer.prefix_lora_a, a=math.sqrt(5))
            layer.prefix_lora_b = nn.Parameter(torch.zeros(out_features, lora_rank, device=device, dtype=dtype))
        return layer

    def forward_prefix(self, x: Tensor) -> Tensor:
        if self.lora_rank is None:
            return F.linear(x, self.prefix_weight, self.prefix_bias)
        return F.linear(x, self.weight, self.bias) + F.linear(F.linear(x, self.prefix_lora_a), self.prefix_lora_b)

    def forward_patches(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, lora_rank={self.lora_rank}"
