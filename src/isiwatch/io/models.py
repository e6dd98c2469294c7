"""Models from checkpoint files: the timm ViT a checkpoint describes, with the token specialisation it records
re-applied and its weights loaded strictly; and specialised checkpoints read and written.

It sits above `isiwatch.io.checkpoint` (reading and writing files, no model transformations) and
`isiwatch.specialization.convert` (the transformation, no files to read).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import timm
import torch
from torch import nn

from .._utils.files import file_identity
from .._utils.option_error import OptionError
from ..specialization.convert import (
    EXACTNESS_TOLERANCE,
    SPECIALIZE_KEY,
    QkvBlocks,
    SpecializeOptions,
    conversion_error,
    parameter_overhead,
    specialization,
    specialize,
)
from .checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
from .model_images import model_input


def apply_recorded(model: nn.Module, record: object, source: str | Path) -> nn.Module:
    """Re-apply the specialisation recorded in checkpoint ``source`` (`build_model` calls it)."""
    try:
        options = SpecializeOptions.from_dict(record)
        return specialize(model, options.norms, list(options.qkv_blocks), options.lora_rank, options.layer_scale)
    except ValueError as exc:
        raise CheckpointError(f"{source}: cannot re-apply its recorded specialisation: {exc}") from None


def save_specialized(path: str | Path, model: nn.Module, arch: str, model_kwargs: dict[str, Any],
                     metadata: dict[str, Any] | None = None, fmt: str = "pt") -> Path:
    """Write a specialised model as an isiwatch checkpoint that records its options (atomic)."""
    options = specialization(model)
    if options is None:
        raise ValueError("the model is not specialised; call isiwatch.specialize() first")
    return save_checkpoint(path, arch, model_kwargs, model.state_dict(),
                           {**(metadata or {}), SPECIALIZE_KEY: options.to_dict()}, fmt)


def build_model(ckpt: Checkpoint) -> nn.Module:
    """``timm.create_model(arch, **model_kwargs)``, token-specialised when the checkpoint records a
    specialisation, with the weights loaded strictly."""
    try:
        model = timm.create_model(ckpt.arch, pretrained=False, **ckpt.model_kwargs)
    except Exception as exc:  # timm raises RuntimeError/KeyError/TypeError for unknown archs/kwargs
        raise CheckpointError(f"{ckpt.path}: cannot build timm model {ckpt.arch!r}: {exc}") from None
    if SPECIALIZE_KEY in ckpt.metadata:  # written by `isiwatch specialize`: re-apply before loading
        apply_recorded(model, ckpt.metadata[SPECIALIZE_KEY], ckpt.path)
    try:
        model.load_state_dict(ckpt.state_dict, strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[1].strip() if "\n" in str(exc) else str(exc)
        raise CheckpointError(f"{ckpt.path}: weights do not fit {ckpt.arch!r}: {first}") from None
    return model


def load_specialized(path: str | Path, arch: str | None = None) -> nn.Module:
    """Rebuild a specialised checkpoint: timm model → recorded specialisation → strict weight load."""
    ckpt = load_checkpoint(path, arch=arch)
    if SPECIALIZE_KEY not in ckpt.metadata:
        raise CheckpointError(f"{ckpt.path}: not a specialised checkpoint (no {SPECIALIZE_KEY!r} record)")
    return build_model(ckpt)


def specialize_checkpoint(
    checkpoint: str | Path,
    out: str | Path,
    *,
    arch: str | None = None,
    num_heads: int | None = None,
    norms: bool = True,
    qkv_blocks: QkvBlocks = None,
    lora_rank: int | None = None,
    layer_scale: bool = False,
    fmt: str = "pt",
    prefer_ema: bool = True,
) -> dict[str, Any]:
    """Specialise a checkpoint into ``out`` and report parameters and the conversion error.

    The error is measured on 8 seeded random inputs of the model's input shape; a conversion that changes
    the outputs by more than `EXACTNESS_TOLERANCE` is refused and nothing is written.
    """
    checkpoint, out = Path(checkpoint), Path(out)
    if file_identity(out) == file_identity(checkpoint):
        raise OptionError("{target}: {out} must differ from the input checkpoint (inputs are never modified)",
                          target=out)
    ckpt = load_checkpoint(checkpoint, arch=arch, prefer_ema=prefer_ema, num_heads=num_heads)
    original = build_model(ckpt)
    model = build_model(ckpt)
    specialize(model, norms=norms, qkv_blocks=qkv_blocks, lora_rank=lora_rank, layer_scale=layer_scale)
    size, in_chans = model_input(original)
    images = torch.randn(8, in_chans, *size, generator=torch.Generator().manual_seed(0))
    error = conversion_error(original, model, images)
    if not error <= EXACTNESS_TOLERANCE:
        raise ValueError(f"conversion changed the outputs by {error:.2e} > {EXACTNESS_TOLERANCE:.0e}; "
                         "nothing written")
    source = {"path": str(checkpoint), "sha256": ckpt.sha256}
    save_specialized(out, model, ckpt.arch, ckpt.model_kwargs, {**ckpt.metadata, "specialized_from": source}, fmt)
    options = specialization(model)
    assert options is not None  # specialize() above made the model a specialised one
    return {"out": str(out), "arch": ckpt.arch, "options": options.to_dict(),
            **parameter_overhead(model), "max_abs_diff": error}
