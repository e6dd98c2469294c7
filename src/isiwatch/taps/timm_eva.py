"""timm ``Eva`` (EVA, EVA-02 and the ``vit_*_rope_*`` models): rotary position embedding, SwiGLU, registers.

EVA applies its rotary embedding to q and k inside the attention's forward, after the q/k norms, so no
module output holds the rotated q/k: the tap reads them where torch's ``scaled_dot_product_attention``
receives them (or the softmax input on the unfused path), which also covers grouped k/v heads and the
mixed/axial rope variants. Cost: one fp32 copy of q and k per block during the probe pass.

Y = X + ``drop_path1`` output (the γ-scaled attention branch). ``EvaBlock`` is pre-norm (norm1(X) is
``norm1``'s output); ``EvaBlockPostNorm`` applies ``norm1`` to the attention output, so attention reads X.
"""

from __future__ import annotations

from torch import nn

from .parts import BlockParts, ViTParts, branch_output, defined_in


def parts(model: nn.Module) -> ViTParts | None:
    if not defined_in(model, "timm"):
        return None
    from timm.models.eva import Eva, EvaBlock, EvaBlockPostNorm

    if not isinstance(model, Eva):
        return None
    p, has_cls = model.num_prefix_tokens, model.cls_token is not None
    blocks = []
    for block in model.blocks:
        if not isinstance(block, (EvaBlock, EvaBlockPostNorm)):
            return None
        norm = block.norm1 if isinstance(block, EvaBlock) else None
        blocks.append(BlockParts(block, (block.attn,), ((block.drop_path1, branch_output),), norm, p, has_cls))
    return ViTParts("timm", blocks, model.patch_embed, p, has_cls)
