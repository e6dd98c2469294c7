"""``specialize``: give a timm ViT's prefix tokens ([CLS], distillation, registers) their own norms and QKV.

The remedy half of the ``norm_friction`` diagnosis (arXiv 2602.08626): the norm layers already work to
separate [CLS] from the patches, so let them do it explicitly. Every block's ``norm1``/``norm2`` (and
optionally ``ls1``/``ls2``) get prefix-token affine parameters; optionally the QKV projection of some
blocks (the paper: the first third) gets a prefix-token copy or a LoRA update. Attention still mixes all
tokens, the projections' FLOPs are unchanged, and at conversion the model computes the same function.

A specialised checkpoint records its options under the ``specialize`` metadata key;
`isiwatch.io.models.build_model` re-applies them (``apply_recorded``) before loading the weights strictly,
so ``isiwatch analyze`` loads it like any other isiwatch checkpoint. Reading and writing checkpoint files of
specialised models (``apply_recorded``, ``save_specialized``, ``load_specialized``) is in `isiwatch.io.models`:
this module transforms models and reads no files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeGuard

import torch
from timm.layers import LayerScale  # type: ignore[attr-defined]  # timm re-exports without __all__ or "as"
from timm.models.vision_transformer import Attention as VitAttention  # type: ignore[attr-defined]  # same
from torch import nn

from ..taps import vit_parts
from .token_split import PrefixSplit, TokenLayerNorm, TokenLayerScale, TokenLinear

#: Metadata key under which a specialised checkpoint records its `SpecializeOptions`.
SPECIALIZE_KEY = "specialize"
FIRST_THIRD = "first_third"
#: Largest output change at conversion accepted by `specialize_checkpoint` (fp32).
EXACTNESS_TOLERANCE = 1e-5

QkvBlocks = str | int | Sequence[int] | None


@dataclass(frozen=True)
class SpecializeOptions:
    """What a model's specialisation consists of; ``qkv_blocks`` are block indices."""

    norms: bool = True
    qkv_blocks: tuple[int, ...] = ()
    lora_rank: int | None = None
    layer_scale: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "qkv_blocks": list(self.qkv_blocks)}

    @classmethod
    def from_dict(cls, record: object) -> SpecializeOptions:
        """Options as recorded in a checkpoint; anything malformed is a ValueError."""
        if not isinstance(record, Mapping) or set(record) - set(cls.__dataclass_fields__):
            raise ValueError(f"expected a mapping with keys {sorted(cls.__dataclass_fields__)}, got {record!r}")
        blocks = record.get("qkv_blocks", [])
        rank = record.get("lora_rank")
        flags = (record.get("norms", True), record.get("layer_scale", False))
        if not all(isinstance(f, bool) for f in flags) or not isinstance(blocks, (list, tuple)) or not all(
                _is_int(b) for b in blocks) or not (rank is None or _is_int(rank)):
            raise ValueError(f"malformed specialisation record {dict(record)!r}")
        return cls(flags[0], tuple(blocks), rank, flags[1])


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def resolve_qkv_blocks(qkv_blocks: QkvBlocks, depth: int) -> tuple[int, ...]:
    """Block indices for ``qkv_blocks``: None → none, ``"first_third"`` → the first round(depth/3) blocks
    (at least one; 4 of 12, 2 of 6, 1 of 4),
    an int k → the first k blocks, a sequence → those indices."""
    if qkv_blocks is None:
        return ()
    if isinstance(qkv_blocks, str):
        if qkv_blocks != FIRST_THIRD:
            raise ValueError(f"qkv_blocks must be {FIRST_THIRD!r}, a block count or a list of blocks, "
                             f"got {qkv_blocks!r}")
        return tuple(range(max(1, round(depth / 3))))
    if _is_int(qkv_blocks):
        if not 0 <= qkv_blocks <= depth:
            raise ValueError(f"qkv_blocks={qkv_blocks}: the model has {depth} blocks")
        return tuple(range(qkv_blocks))
    if isinstance(qkv_blocks, int):  # a bool, which list() would refuse with a TypeError too
        raise TypeError(f"qkv_blocks must be {FIRST_THIRD!r}, a block count or a list of blocks, got {qkv_blocks!r}")
    blocks = list(qkv_blocks)
    if not all(_is_int(b) and 0 <= b < depth for b in blocks) or len(set(blocks)) != len(blocks):
        raise ValueError(f"qkv_blocks {blocks} must be distinct block indices in [0, {depth - 1}]")
    return tuple(sorted(blocks))


def _timm_blocks(model: nn.Module) -> tuple[list[Any], int]:
    """The model's timm blocks (norm1, norm2 and attn.qkv checked; read by attribute) and its prefix-token count."""
    parts = vit_parts(model)
    if parts.family != "timm":
        raise ValueError(f"specialize supports timm ViTs; this is a {parts.family} model")
    for index, bp in enumerate(parts.blocks):
        if not all(hasattr(bp.block, n) for n in ("norm1", "norm2")) or not hasattr(bp.block.attn, "qkv"):
            raise ValueError(f"block {index} ({type(bp.block).__name__}) is not a pre-norm timm Block with "
                             "norm1, norm2 and attn.qkv")
    if parts.num_prefix_tokens == 0:
        raise ValueError("the model has no prefix tokens ([CLS], distillation or register tokens) to specialise")
    return [bp.block for bp in parts.blocks], parts.num_prefix_tokens


def specialize(
    model: nn.Module,
    norms: bool = True,
    qkv_blocks: QkvBlocks = None,
    lora_rank: int | None = None,
    layer_scale: bool = False,
) -> nn.Module:
    """Token-specialise a timm ViT in place and return it.

    New parameters start as copies of the shared ones (LoRA: a zero update), so at conversion the model
    computes the same function, and they train with the model. The model is left untouched when any option
    does not fit it.

    Args:
        model: A timm ViT with prefix tokens ([CLS], distillation, registers).
        norms: Prefix-token affine parameters in every block's ``norm1`` and ``norm2``.
        qkv_blocks: Blocks whose QKV projection gets a prefix-token copy: ``"first_third"``, a count, indices,
            or None for none.
        lora_rank: Give those blocks a rank-``lora_rank`` LoRA update instead of a full copy.
        layer_scale: Prefix-token ``ls1``/``ls2`` scales (needs a model built with ``init_values``).

    Returns:
        The same model, specialised.
    """
    if specialization(model) is not None:
        raise ValueError("the model is already specialised")
    blocks, prefix = _timm_blocks(model)
    qkv = resolve_qkv_blocks(qkv_blocks, len(blocks))
    if lora_rank is not None and not qkv:
        raise ValueError("lora_rank needs qkv_blocks (LoRA specialises the QKV projection)")
    if not (norms or qkv or layer_scale):
        raise ValueError("nothing to specialise: enable norms, qkv_blocks or layer_scale")
    replacements: list[tuple[nn.Module, str, nn.Module]] = []
    for index, block in enumerate(blocks):
        if norms:
            for name in ("norm1", "norm2"):
                replacements.append((block, name, TokenLayerNorm.from_norm(getattr(block, name), prefix)))
        if layer_scale:
            for name in ("ls1", "ls2"):
                if not isinstance(getattr(block, name, None), LayerScale):
                    raise ValueError(f"block {index} has no LayerScale {name} (build the model with init_values)")
                replacements.append((block, name, TokenLayerScale.from_layer_scale(getattr(block, name), prefix)))
        if index in qkv:
            if not isinstance(block.attn, VitAttention):
                raise ValueError(f"block {index}: {type(block.attn).__name__} does not compute q, k, v through its "
                                 "qkv module alone (EVA and BEiT add separate biases); qkv_blocks cannot specialise it")
            replacements.append((block.attn, "qkv", TokenLinear.from_linear(block.attn.qkv, prefix, lora_rank)))
    for parent, name, layer in replacements:
        setattr(parent, name, layer)
    return model


def specialization(model: nn.Module) -> SpecializeOptions | None:
    """The options a model was specialised with, read from its layers; None for a plain model."""
    if not any(isinstance(m, PrefixSplit) for m in model.modules()):
        return None
    blocks, _ = _timm_blocks(model)
    qkv = [i for i, b in enumerate(blocks) if isinstance(b.attn.qkv, TokenLinear)]
    return SpecializeOptions(
        norms=isinstance(blocks[0].norm1, TokenLayerNorm),
        qkv_blocks=tuple(qkv),
        lora_rank=blocks[qkv[0]].attn.qkv.lora_rank if qkv else None,
        layer_scale=isinstance(getattr(blocks[0], "ls1", None), TokenLayerScale),
    )


def parameter_overhead(model: nn.Module) -> dict[str, float]:
    """Prefix-token parameters added by [`specialize`][isiwatch.specialize]: counts and the fraction of the base
    model."""
    added = sum(p.numel() for n, p in model.named_parameters() if n.rsplit(".", 1)[-1].startswith("prefix_"))
    total = sum(p.numel() for p in model.parameters())
    return {"base": total - added, "added": added, "fraction": added / (total - added)}


@torch.no_grad()
def conversion_error(model: nn.Module, converted: nn.Module, images: torch.Tensor) -> float:
    """Largest absolute difference between the two models' outputs on ``images`` (eval mode)."""
    model.eval()
    converted.eval()
    return float((model(images) - converted(images)).abs().max())


def parse_qkv_blocks(text: str) -> QkvBlocks:
    """The CLI's ``--qkv-blocks``: ``none``, ``first_third``, a count ``K`` or indices ``0,2,5``."""
    text = text.strip()
    if text in ("none", ""):
        return None
    if text == FIRST_THIRD:
        return FIRST_THIRD
    try:
        return int(text) if text.isdigit() else [int(t) for t in text.split(",")]
    except ValueError:
        raise ValueError(f"--qkv-blocks: expected none, first_third, a count or indices like 0,1,2; "
                         f"got {text!r}") from None
