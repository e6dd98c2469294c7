"""Hugging Face transformers ViT, DeiT (distilled too), BEiT, DINOv2 and DINOv2-with-registers.

All are pre-norm: norm1(X) is ``layernorm_before`` (``norm1`` in DINOv2); Y = X + the attention output,
scaled by BEiT's ``lambda_1`` or passed through DINOv2's ``layer_scale1``. The attention scores are read
where transformers' attention function computes them (torch's ``scaled_dot_product_attention`` or the eager
softmax), so BEiT's relative position bias, passed as the attention mask, is in them. Prefix tokens:
[CLS], DeiT's distillation token and DINOv2's registers, in that order.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .parts import BlockParts, BranchFn, ViTParts, all_blocks, branch_output, defined_in, first_output


def layer_list(model: nn.Module) -> nn.ModuleList | None:
    """The transformer layers of a transformers vision model (``layers``, ``encoder.layer[s]``)."""
    encoder = getattr(model, "encoder", None)
    for holder, name in ((model, "layers"), (encoder, "layer"), (encoder, "layers")):
        layers = getattr(holder, name, None) if holder is not None else None
        if isinstance(layers, nn.ModuleList) and len(layers):
            return layers
    return None


def _layer(layer: Any, p: int, has_cls: bool) -> BlockParts | None:
    attn = getattr(layer, "attention", None)
    if attn is None:
        return None
    if hasattr(layer, "layernorm_before"):  # ViT, DeiT, BEiT
        scale = getattr(layer, "lambda_1", None)
        branch: BranchFn = branch_output if scale is None else (lambda _i, out: scale * first_output(out))
        return BlockParts(layer, (attn,), ((attn, branch),), layer.layernorm_before, p, has_cls)
    if hasattr(layer, "norm1") and hasattr(layer, "layer_scale1"):  # DINOv2
        return BlockParts(layer, (attn,), ((layer.layer_scale1, branch_output),), layer.norm1, p, has_cls)
    return None


def parts(model: nn.Module) -> ViTParts | None:
    if not defined_in(model, "transformers"):
        return None
    embeddings = getattr(model, "embeddings", None)
    layers = layer_list(model)
    if embeddings is None or layers is None or not hasattr(embeddings, "patch_embeddings"):
        return None
    has_cls = getattr(embeddings, "cls_token", None) is not None
    registers = getattr(embeddings, "register_tokens", None)
    p = int(has_cls) + int(getattr(embeddings, "distillation_token", None) is not None) + (
        0 if registers is None else registers.shape[1])
    blocks = [_layer(layer, p, has_cls) for layer in layers]
    if not all_blocks(blocks):
        return None
    return ViTParts("transformers", blocks, embeddings.patch_embeddings, p, has_cls)
