"""timm ``Cait``: self-attention blocks over the patches, then class-attention blocks where [CLS] joins.

- Self-attention blocks (``blocks``, talking-heads attention): X, Y, Z are the patch tokens only; there is
  no [CLS] yet, so the [CLS] metrics and the [CLS] probe are undefined (NaN) there. The attention scores are
  the input of the softmax, i.e. after the pre-softmax head mixing (``proj_l``); the post-softmax mixing
  (``proj_w``) is not part of the distribution whose entropy is reported.
- Class-attention blocks (``blocks_token_only``): only [CLS] queries and is updated; X = [CLS ; patches],
  Y and Z replace [CLS] and keep the patches. Entropy is that of [CLS]'s attention over all tokens;
  ``cls_attention_share`` (what patch queries pay to [CLS]) is undefined (NaN) as patches do not query.
Y = X + γ₁ · attention output. Truncation drops self-attention blocks only; class-attention blocks are kept.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .parts import BlockParts, TokensFn, ViTParts, block_io, defined_in, first_output


def _class_attention_io(args: tuple[Any, ...], kwargs: dict[str, Any],
                        output: Any) -> tuple[torch.Tensor, torch.Tensor]:
    x, x_cls = (*args, *kwargs.values())[:2]
    return torch.cat([x_cls, x], dim=1), torch.cat([first_output(output), x], dim=1)


def _block(b: Any, p: int, has_cls: bool, tokens: TokensFn = block_io) -> BlockParts:
    """A ``LayerScaleBlock`` or ``LayerScaleBlockClassAttn`` (read by attribute): Y = X + γ₁ · attention output."""
    return BlockParts(b, (b.attn,), ((b.attn, lambda _i, out: b.gamma_1 * out),), b.norm1, p, has_cls, tokens)


def parts(model: nn.Module) -> ViTParts | None:
    if not defined_in(model, "timm"):
        return None
    from timm.models.cait import Cait, LayerScaleBlock, LayerScaleBlockClassAttn

    if not isinstance(model, Cait):
        return None
    if not all(isinstance(b, LayerScaleBlock) for b in model.blocks) or not all(
            isinstance(b, LayerScaleBlockClassAttn) for b in model.blocks_token_only):
        return None
    has_cls = model.cls_token is not None
    blocks = [_block(b, 0, False) for b in model.blocks]
    blocks += [_block(b, 1, has_cls, _class_attention_io) for b in model.blocks_token_only]
    return ViTParts("timm", blocks, model.patch_embed, model.num_prefix_tokens, has_cls,
                    droppable_blocks=len(model.blocks))
