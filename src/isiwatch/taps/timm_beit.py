"""timm ``Beit`` (BEiT, BEiT v2): relative position bias and layer-scale γ.

The relative position bias (per block, plus the optional shared one) is added to the attention scores: on
the fused path it is the mask torch's ``scaled_dot_product_attention`` receives, on the unfused path it is
in the softmax input, so the tap's scores include it. Y = X + ``drop_path1`` output (γ₁ · attention).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .parts import BlockParts, ViTParts, branch_output, defined_in


def parts(model: nn.Module) -> ViTParts | None:
    if not defined_in(model, "timm"):
        return None
    from timm.models.beit import Beit, Block

    if not isinstance(model, Beit) or not all(isinstance(b, Block) for b in model.blocks):
        return None
    p, has_cls = model.num_prefix_tokens, model.cls_token is not None
    beit_blocks: Any = model.blocks  # timm Blocks (checked above), read by attribute
    blocks = [BlockParts(b, (b.attn,), ((b.drop_path1, branch_output),), b.norm1, p, has_cls) for b in beit_blocks]
    return ViTParts("timm", blocks, model.patch_embed, p, has_cls)
