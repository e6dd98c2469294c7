"""Model taps: find a ViT's blocks and hand each block's tensors (SPEC §2) to a consumer on one probe pass.

The hooks live only for the duration of :meth:`Tap.capture`; the consumer sees one block at a time, so
memory does not grow with depth. Attention probabilities are rebuilt from the q/k tensors the attention
module itself computes (after its q/k norms), which works with fused (SDPA) attention without ever
switching the model to the unfused path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn


class TapError(ValueError):
    """The model cannot be tapped; the message names what is missing."""


@dataclass
class BlockTensors:
    """Tensors of block ``index`` on the probe batch, all fp32.

    ``x``: block input X (B,T,D); ``x_normed``: norm1(X); ``y``: X + attention branch;
    ``z``: block output; ``q``/``k``: (B,H,T,hd) as used by the attention; ``scale``: softmax scale.
    """

    index: int
    x: Tensor
    x_normed: Tensor
    y: Tensor
    z: Tensor
    q: Tensor
    k: Tensor
    scale: float


@dataclass
class BlockParts:
    """The modules of one transformer block that the tap hooks."""

    block: nn.Module
    norm1: nn.Module
    attn_branch: nn.Module  # its output is the residual branch added to X (timm: ls1)
    q_source: nn.Module  # its output is q (timm: attn.q_norm; HF: attn.q_proj)
    k_source: nn.Module
    num_heads: int
    scale: float
    qk_layout: str  # "bhtd" (timm, already split into heads) or "btc" (HF projections)


@dataclass
class ViTParts:
    """Everything the tap needs to know about a model."""

    family: str
    blocks: list[BlockParts]
    patch_embed: nn.Module | None
    num_prefix_tokens: int
    has_cls: bool

    @property
    def depth(self) -> int:
        return len(self.blocks)


def _first_output(output):
    return output[0] if isinstance(output, (tuple, list)) else output


def _timm_block(block: nn.Module) -> BlockParts | None:
    attn = getattr(block, "attn", None)
    needed = ("norm1", "ls1")
    if attn is None or not all(hasattr(block, n) for n in needed):
        return None
    if not all(hasattr(attn, n) for n in ("q_norm", "k_norm", "num_heads", "scale")):
        return None
    return BlockParts(block, block.norm1, block.ls1, attn.q_norm, attn.k_norm, attn.num_heads,
                      float(attn.scale), "bhtd")


def _hf_block(block: nn.Module) -> BlockParts | None:
    attn = getattr(block, "attention", None)
    if attn is None or not all(hasattr(attn, n) for n in ("q_proj", "k_proj", "head_dim", "scaling")):
        return None
    if hasattr(block, "layernorm_before"):  # transformers ViT
        norm1, branch = block.layernorm_before, attn
    elif hasattr(block, "norm1") and hasattr(block, "layer_scale1"):  # DINOv2
        norm1, branch = block.norm1, block.layer_scale1
    else:
        return None
    heads = attn.q_proj.out_features // attn.head_dim
    return BlockParts(block, norm1, branch, attn.q_proj, attn.k_proj, heads, float(attn.scaling), "btc")


def _find_block_list(model: nn.Module) -> tuple[str, list[BlockParts]] | None:
    for module in model.modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)) or len(module) == 0:
            continue
        for family, parse in (("timm", _timm_block), ("transformers", _hf_block)):
            parts = [parse(b) for b in module]
            if all(p is not None for p in parts):
                return family, parts
    return None


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain module inside DDP/DataParallel (``.module``) and ``torch.compile`` (``._orig_mod``)
    wrappers: probing through it never touches the wrapper's compiled graph or gradient hooks."""
    while True:
        inner = getattr(model, "_orig_mod", None) or getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def vit_parts(model: nn.Module) -> ViTParts:
    """Locate the blocks, patch embedding and prefix tokens of a timm or transformers ViT."""
    model = unwrap_model(model)
    found = _find_block_list(model)
    if found is None:
        raise TapError(
            f"cannot tap {type(model).__name__}: no list of ViT blocks found (expected timm Blocks with "
            "norm1/attn/ls1 or transformers ViT/DINOv2 layers with q_proj/k_proj); "
            "use isiwatch.taps.custom_parts() for other models"
        )
    family, blocks = found
    if family == "timm":
        patch_embed = getattr(model, "patch_embed", None)
        prefix = int(getattr(model, "num_prefix_tokens", 1 if getattr(model, "cls_token", None) is not None
                             else 0))
        has_cls = getattr(model, "cls_token", None) is not None
    else:
        embeddings = next((m for n, m in model.named_modules() if n.endswith("embeddings")
                           and hasattr(m, "patch_embeddings")), None)
        patch_embed = getattr(embeddings, "patch_embeddings", None)
        config = getattr(model, "config", None)
        prefix = 1 + int(getattr(config, "num_register_tokens", 0) or 0)
        has_cls = True
    return ViTParts(family, blocks, patch_embed, prefix, has_cls)


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
    from timm.layers import PatchEmbed

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
    """Describe any pre-norm ViT: name its blocks and, per block, its norm1, residual attention branch
    and attention module (timm-style with q_norm/k_norm or transformers-style with q_proj/k_proj)."""
    parts = []
    for i, block in enumerate(blocks):
        attn = attention(block)
        if all(hasattr(attn, n) for n in ("q_norm", "k_norm", "num_heads", "scale")):
            parts.append(BlockParts(block, norm1(block), attn_branch(block), attn.q_norm, attn.k_norm,
                                    attn.num_heads, float(attn.scale), "bhtd"))
        elif all(hasattr(attn, n) for n in ("q_proj", "k_proj", "head_dim", "scaling")):
            parts.append(BlockParts(block, norm1(block), attn_branch(block), attn.q_proj, attn.k_proj,
                                    attn.q_proj.out_features // attn.head_dim, float(attn.scaling), "btc"))
        else:
            raise TapError(f"block {i}: attention module {type(attn).__name__} exposes neither "
                           "q_norm/k_norm/num_heads/scale nor q_proj/k_proj/head_dim/scaling")
    return ViTParts("custom", parts, patch_embed, num_prefix_tokens, has_cls)


class Tap:
    """Runs one probe pass and streams per-block tensors to consumers.

    ``on_stem(E, X0)`` receives the patch embedding before positional encoding (None when the model has
    no separate patch embedding) and the input of block 0; ``on_block(BlockTensors)`` is called as each
    block finishes.
    """

    def __init__(self, parts: ViTParts):
        self.parts = parts

    @contextlib.contextmanager
    def _hooks(self, on_stem, on_block) -> Iterator[None]:
        handles = []
        state: dict[str, Tensor] = {}

        def keep(key, transform=None):
            def hook(_module, _inputs, output):
                out = _first_output(output)
                state[key] = (transform(out) if transform else out).float()
            return hook

        if self.parts.patch_embed is not None:
            handles.append(self.parts.patch_embed.register_forward_hook(
                keep("E", lambda e: e.flatten(1, -2) if e.dim() > 3 else e)))

        for index, bp in enumerate(self.parts.blocks):
            def pre_hook(_module, args, kwargs, index=index):
                x = args[0] if args else next(iter(kwargs.values()))
                state["X"] = x.float()
                if index == 0:
                    on_stem(state.pop("E", None), state["X"])

            def post_hook(_module, _args, _kwargs, output, bp=bp, index=index):
                q, k = state.pop("q"), state.pop("k")
                if bp.qk_layout == "btc":
                    b, t, _ = q.shape
                    q = q.view(b, t, bp.num_heads, -1).transpose(1, 2)
                    k = k.view(b, t, bp.num_heads, -1).transpose(1, 2)
                x = state.pop("X")
                on_block(BlockTensors(index, x, state.pop("Xn"), x + state.pop("branch"),
                                      _first_output(output).float(), q, k, bp.scale))

            handles += [
                bp.block.register_forward_pre_hook(pre_hook, with_kwargs=True),
                bp.norm1.register_forward_hook(keep("Xn")),
                bp.q_source.register_forward_hook(keep("q")),
                bp.k_source.register_forward_hook(keep("k")),
                bp.attn_branch.register_forward_hook(keep("branch")),
                bp.block.register_forward_hook(post_hook, with_kwargs=True),
            ]
        try:
            yield
        finally:
            for h in handles:
                h.remove()
            state.clear()

    @torch.no_grad()
    def capture(self, model: nn.Module, images: Tensor, on_stem, on_block) -> Tensor:
        """One forward of ``images`` through ``model`` with the hooks in place; returns the model output.

        Runs in eval mode and restores every module's mode and the global RNG state afterwards.
        """
        with preserved_state(model), self._hooks(on_stem, on_block):
            model.eval()
            return model(images)


@contextlib.contextmanager
def preserved_state(model: nn.Module) -> Iterator[None]:
    """Restore each module's train/eval flag and the CPU/CUDA RNG states on exit."""
    modes = [(m, m.training) for m in model.modules()]
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        for m, mode in modes:
            m.training = mode
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
