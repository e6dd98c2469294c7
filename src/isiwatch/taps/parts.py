"""What the tap needs to know about a model: its blocks and, per block, where X, norm1(X), the attention
branch, the attention scores and the output Z come from. Each family adapter (one module per family in
this package) builds these descriptions; [`custom_parts`][isiwatch.custom_parts] lets a user describe any other pre-norm
ViT.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from torch import Tensor, nn


class TapError(ValueError):
    """The model cannot be tapped; the message names what is missing."""


#: Maps a hooked module's (inputs, output) to its share of the attention residual branch (B,T',D).
BranchFn = Callable[[tuple[Any, ...], Any], Tensor]
#: Maps a block call's (args, kwargs, output) to its input X and output Z, both (B,T,D).
TokensFn = Callable[[tuple[Any, ...], dict[str, Any], Any], tuple[Tensor, Tensor]]


def defined_in(model: nn.Module, library: str) -> bool:
    """Whether the model's class or one of its bases comes from ``library`` (FSDP2's ``fully_shard`` and other
    wrappers subclass the model's class on the fly, elsewhere). Lets an adapter skip foreign models without
    importing their library."""
    return any(cls.__module__.split(".")[0] == library for cls in type(model).__mro__)


def first_output(output: Any) -> Tensor:
    """The tensor of a module output that may be a tuple (transformers layers return tuples)."""
    tensor: Tensor = output[0] if isinstance(output, (tuple, list)) else output
    return tensor


def branch_output(_inputs: tuple[Any, ...], output: Any) -> Tensor:
    """The hooked module's output is the branch itself (timm: ``drop_path1``)."""
    return first_output(output)


def block_io(args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> tuple[Tensor, Tensor]:
    """X is the block's first argument (positional or keyword), Z its output."""
    x = args[0] if args else next(iter(kwargs.values()))
    return x, first_output(output)


@dataclass
class BlockParts:
    """One transformer block, as the tap reads it.

    ``attention``: the modules inside which the attention scores are recorded (several for parallel
    attentions, whose heads are then put side by side); ``branch``: (module, fn) pairs whose fn(inputs,
    output) sum to the residual branch that the attention adds to X, so Y = X + branch (a branch covering
    fewer tokens than X updates the first tokens, e.g. CaiT's [CLS]); ``norm``: the module whose output is
    norm1(X), None when attention reads X itself (post-norm blocks); ``num_prefix_tokens`` / ``has_cls``:
    the prefix tokens present in this block's X (CaiT's [CLS] joins only at the class-attention blocks).
    """

    block: nn.Module
    attention: tuple[nn.Module, ...]
    branch: tuple[tuple[nn.Module, BranchFn], ...]
    norm: nn.Module | None
    num_prefix_tokens: int
    has_cls: bool
    tokens: TokensFn = field(default=block_io)


@dataclass
class ViTParts:
    """Everything the tap needs to know about a model.

    ``patch_embed``: module whose output is the patch embedding E before positional encoding (None when the
    model has none); ``embed_tokens`` turns that output into (B,N,D) tokens; ``num_prefix_tokens`` / ``has_cls``
    describe the model's token sequence (the blocks may see fewer, see `BlockParts`);
    ``droppable_blocks``: how many leading blocks truncation may drop (None: all; CaiT: its self-attention blocks);
    ``fixed_block_positions``: why a block cannot move to another index when others are dropped (None: it can).
    """

    family: str
    blocks: list[BlockParts]
    patch_embed: nn.Module | None
    num_prefix_tokens: int
    has_cls: bool
    embed_tokens: Callable[[Any], Tensor] = field(default=lambda out: embedded_tokens(out))
    droppable_blocks: int | None = None
    fixed_block_positions: str | None = None

    def __post_init__(self) -> None:
        """Refuse blocks that share one module (a weight-tied or repeated block): the tap hooks each module once,
        so their records would mix and the Watch would fail mid-run instead of here."""
        first: dict[int, int] = {}
        for i, block in enumerate(self.blocks):
            j = first.setdefault(id(block.block), i)
            if j != i:
                raise TapError(f"block {i} is the same module as block {j} ({type(block.block).__name__}): isiwatch "
                               f"taps each block once, so a model whose blocks share one module cannot be watched "
                               f"or cut; give each block its own module")

    @property
    def depth(self) -> int:
        return len(self.blocks)

    @property
    def droppable(self) -> int:
        return self.depth if self.droppable_blocks is None else self.droppable_blocks


def all_blocks(blocks: list[BlockParts | None]) -> TypeGuard[list[BlockParts]]:
    """Whether the adapter described every block (None marks a block it does not know)."""
    return not any(b is None for b in blocks)


def embedded_tokens(output: Any) -> Tensor:
    """(B,N,D) tokens from a patch embedding's output: a tuple's first tensor, channels-last grids flattened."""
    return tokens_last(first_output(output))


def tokens_last(e: Tensor) -> Tensor:
    """(B,N,D) from a channels-last patch grid (B,h,w,D) or tokens (B,N,D)."""
    return e.flatten(1, -2) if e.dim() > 3 else e


def channels_first_tokens(e: Tensor) -> Tensor:
    """(B,N,D) from a convolution's (B,D,h,w) patch grid."""
    return e.flatten(2).transpose(1, 2)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain module inside DDP/DataParallel (``.module``) and ``torch.compile`` (``._orig_mod``)
    wrappers: probing through it never touches the wrapper's compiled graph or gradient hooks."""
    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def input_problem(parts: ViTParts, shape: Sequence[int]) -> str | None:
    """Why images of ``shape`` (B,C,H,W) cannot go through the model's patch embedding, read from its modules
    without a forward pass: the channel count (transformers' ``num_channels``, else the first Conv2d's input
    channels) and, for timm's ``PatchEmbed``, the image size it asserts. None when nothing is wrong or
    nothing can be told (no patch embedding, a linear one)."""
    embed = parts.patch_embed
    if embed is None:
        return None
    _, c, h, w = shape
    channels = getattr(embed, "num_channels", None)
    if not isinstance(channels, int):
        conv = next((m for m in embed.modules() if isinstance(m, nn.Conv2d)), None)
        channels = None if conv is None else conv.in_channels
    if channels is not None and c != channels:
        return f"{c}-channel images, but the model's patch embedding takes {channels} channels"
    from timm.layers.patch_embed import PatchEmbed  # where timm.layers re-exports it from

    if isinstance(embed, PatchEmbed) and embed.img_size is not None:
        (size_h, size_w), (patch_h, patch_w) = embed.img_size, embed.patch_size
        if embed.strict_img_size and (h, w) != (size_h, size_w):
            return f"{h}×{w} images, but the model takes {size_h}×{size_w}"
        if not embed.strict_img_size and not embed.dynamic_img_pad and (h % patch_h or w % patch_w):
            return f"{h}×{w} images, but the model's patch size {patch_h}×{patch_w} must divide them"
    return None


def custom_parts(
    blocks: Sequence[nn.Module],
    *,
    num_prefix_tokens: int,
    has_cls: bool,
    norm1: Callable[[nn.Module], nn.Module],
    attn_branch: Callable[[nn.Module], nn.Module],
    attention: Callable[[nn.Module], nn.Module],
    patch_embed: nn.Module | None = None,
) -> ViTParts:
    """Describe any pre-norm ViT: name its blocks and, per block, its norm1, the module whose output is the
    residual attention branch, and the attention module (any module that calls torch's
    ``scaled_dot_product_attention`` or a softmax over keys)."""
    parts = [BlockParts(block, (attention(block),), ((attn_branch(block), branch_output),), norm1(block),
                        num_prefix_tokens, has_cls) for block in blocks]
    return ViTParts("custom", parts, patch_embed, num_prefix_tokens, has_cls)
