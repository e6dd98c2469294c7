"""timm ``VisionTransformer`` (and DeiT, relpos ViTs, NaFlexViT): pre-norm, post-norm and parallel blocks.

X is a block's input and Z its output. Y = X + the attention's share of the residual update:
- ``Block`` / ``RelPosBlock`` (pre-norm): ``drop_path1(ls1(attn(norm1(X))))``; norm1(X) is ``norm1``'s output.
- ``ResPostBlock`` / ``ResPostRelPosBlock`` (post-norm): ``drop_path1(norm1(attn(X)))``; attention reads X
  itself, so norm1(X) is X.
- ``ParallelThingsBlock``: attention and MLP branches added in turn; Y = X + Σ of its parallel attention
  branches (their heads side by side in the scores); norm1(X) is the first attention branch's norm.
- ``ParallelScalingBlock`` / ``DiffParallelScalingBlock``: attention and MLP read the same ``in_norm(X)`` and
  are added at once; Y = X + ``ls`` of the attention half of the output projection (the projection bias
  counts as MLP). Differential attention's two softmax maps both count as heads.
Differential attention's λ_init is a function of the block's index, so those blocks cannot move to another index
when a cut drops earlier ones (``fixed_block_positions``).
The relative position bias of the relpos ViTs is the mask torch's attention receives, so it is in the scores.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch.nn.functional as F
from torch import Tensor, nn

from .parts import (
    BlockParts,
    BranchFn,
    ViTParts,
    all_blocks,
    branch_output,
    channels_first_tokens,
    defined_in,
    embedded_tokens,
    first_output,
)

if TYPE_CHECKING:
    from timm.models.vision_transformer import DiffParallelScalingBlock, ParallelScalingBlock


def _fused_projection_share(block: ParallelScalingBlock | DiffParallelScalingBlock) -> BranchFn:
    """Attention share of ``ls(out_proj(cat(x_attn, x_mlp)))``: the projection of x_attn alone."""
    proj = block.out_proj
    width = proj.out_features  # x_attn has the block's width

    def share(inputs: tuple[Any, ...], _output: Any) -> Tensor:
        scaled: Tensor = block.ls(F.linear(inputs[0][..., :width], proj.weight[:, :width]))
        return scaled
    return share


def block_parts(block: nn.Module, p: int, has_cls: bool) -> BlockParts | None:
    """Describe one timm ViT block, or None when it is not one of this module's block types."""
    from timm.models.vision_transformer import (
        Block,
        DiffParallelScalingBlock,
        ParallelScalingBlock,
        ParallelThingsBlock,
        ResPostBlock,
    )
    from timm.models.vision_transformer_relpos import RelPosBlock, ResPostRelPosBlock

    if isinstance(block, (Block, RelPosBlock)):
        return BlockParts(block, (block.attn,), ((block.drop_path1, branch_output),), block.norm1, p, has_cls)
    if isinstance(block, (ResPostBlock, ResPostRelPosBlock)):
        return BlockParts(block, (block.attn,), ((block.drop_path1, branch_output),), None, p, has_cls)
    if isinstance(block, ParallelThingsBlock):
        attns: Any = block.attns  # timm's attention branches, read by attribute
        return BlockParts(block, tuple(a.attn for a in attns), tuple((a.drop_path, branch_output) for a in attns),
                          attns[0].norm, p, has_cls)
    if isinstance(block, (ParallelScalingBlock, DiffParallelScalingBlock)):
        branch: tuple[tuple[nn.Module, BranchFn], ...]
        if getattr(block, "out_proj", None) is not None:
            branch = ((block.out_proj, _fused_projection_share(block)),)
        else:  # not fused: the attention half has its own projection
            branch = ((cast(nn.Module, block.attn_out_proj), lambda _inputs, output: block.ls(output)),)
        return BlockParts(block, (block,), branch, block.in_norm, p, has_cls)
    return None


def parts(model: nn.Module) -> ViTParts | None:
    """timm VisionTransformer / VisionTransformerDistilled / VisionTransformerRelPos / NaFlexVit."""
    if not defined_in(model, "timm"):
        return None
    from timm.models.naflexvit import NaFlexVit
    from timm.models.vision_transformer import DiffParallelScalingBlock, VisionTransformer
    from timm.models.vision_transformer_relpos import VisionTransformerRelPos

    embed: nn.Module
    embed_tokens: Callable[[Any], Tensor]
    if isinstance(model, NaFlexVit):
        embed, has_cls = model.embeds.proj, model.embeds.cls_token is not None
        embed_tokens = channels_first_tokens if isinstance(embed, nn.Conv2d) else first_output
    elif isinstance(model, (VisionTransformer, VisionTransformerRelPos)):
        embed, has_cls, embed_tokens = model.patch_embed, model.cls_token is not None, embedded_tokens
    else:
        return None
    p = model.num_prefix_tokens
    blocks = [block_parts(b, p, has_cls) for b in model.blocks]
    if not all_blocks(blocks):
        return None
    fixed = ("its differential-attention λ_init depends on the block's index"
             if any(isinstance(b, DiffParallelScalingBlock) for b in model.blocks) else None)
    return ViTParts("timm", blocks, embed, p, has_cls, embed_tokens, fixed_block_positions=fixed)

