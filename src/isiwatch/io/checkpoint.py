"""A ViT checkpoint resolved to a timm architecture and a plain state dict (`load_checkpoint`), and isiwatch's own
checkpoint files (`save_checkpoint`).

The parts live in their own modules and are re-exported here: reading a file without running code
(`isiwatch.io.checkpoint_file`), the state dict, recorded model keyword arguments and data config inside it
(`isiwatch.io.checkpoint_contents`), and the architecture its tensors imply (`isiwatch.io.vit_arch`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .._utils.files import atomic_write
from .checkpoint_contents import (
    AUGMENT_ARGS,
    DATA_ARGS,
    QKV_WEIGHT,
    WEIGHT_SOURCES,
    check_finite_weights,
    check_tensors,
    data_config,
    recorded_kwargs,
    state_dict_of,
    strip_prefix,
    training_lr,
)
from .checkpoint_file import CheckpointError, CheckpointOptionError, read_raw, sha256_of
from .vit_arch import BASE_ARCH, BASE_DISTILLED_ARCH, arch_config, infer_vit_kwargs, is_other_family, num_heads_of

__all__ = ["AUGMENT_ARGS", "BASE_ARCH", "BASE_DISTILLED_ARCH", "DATA_ARGS", "WEIGHT_SOURCES", "Checkpoint",
           "CheckpointError", "CheckpointOptionError", "arch_config", "check_finite_weights", "infer_vit_kwargs",
           "load_checkpoint", "read_raw", "save_checkpoint", "sha256_of"]


@dataclass
class Checkpoint:
    """A ViT checkpoint resolved to a timm architecture and a plain state dict."""

    path: Path
    arch: str
    model_kwargs: dict[str, Any]
    state_dict: dict[str, Tensor]
    sha256: str
    metadata: dict[str, Any] = field(default_factory=dict)
    #: Which weights were read: "ema" (``state_dict_ema``) or "state_dict" (any other state dict).
    weights: str = "state_dict"
    #: The data config the weights were trained with: timm ``train.py``'s recorded args of its preprocessing and
    #: augmentation (``mean``, ``std``, ``interpolation``, ``crop_pct``, ``input_size``, ``hflip``, ...) and a
    #: ``source`` of ``mean``/``std``, or isiwatch's own metadata; empty when none is recorded.
    data_config: dict[str, Any] = field(default_factory=dict)
    #: The peak learning rate the weights were trained at, when recorded (`training_lr`): healing defaults below it.
    training_lr: float | None = None


def _metadata(path: Path, raw: dict[str, Any]) -> dict[str, Any]:
    """isiwatch's own record in the checkpoint (``isiwatch``), empty when there is none."""
    meta = raw.get("isiwatch") or {}
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: its 'isiwatch' record is not a mapping ({type(meta).__name__})")
    return meta


def _family_checkpoint(path: Path, raw: dict[str, Any], arch: str, state: dict[str, Tensor],
                       weights: str) -> Checkpoint:
    """A checkpoint of another timm ViT family: its recorded keyword arguments, with the class count and input
    channels read from the head and patch-embedding tensors when it records none; the strict load checks the rest."""
    check_tensors(path, state)
    kwargs = recorded_kwargs(path, raw)
    head, proj = state.get("head.weight"), state.get("patch_embed.proj.weight", state.get("embeds.proj.weight"))
    if head is not None and head.dim() == 2:
        kwargs.setdefault("num_classes", head.shape[0])
    if proj is not None and proj.dim() == 4:
        kwargs.setdefault("in_chans", proj.shape[1])
    meta = _metadata(path, raw)
    return Checkpoint(path, arch, kwargs, state, sha256_of(path), meta, weights, data_config(path, raw, meta),
                      training_lr(raw, meta))


def load_checkpoint(path: str | Path, arch: str | None = None, prefer_ema: bool = True,
                    num_heads: int | None = None) -> Checkpoint:
    """Read a ViT checkpoint and resolve its timm architecture.

    Shapes come from the tensors. The head count changes no shape, so it must come from the checkpoint's
    ``model_kwargs`` (its own or timm ``train.py``'s ``args``), from ``num_heads``, or from the default config
    of the recorded or given ``arch``; when none has it the checkpoint is refused. An ``arch`` whose config
    contradicts the checkpoint (its tensors, recorded head count or recorded architecture) is refused too.
    """
    path = Path(path)
    raw = read_raw(path)
    wrapped, weights = state_dict_of(raw, prefer_ema)
    state = strip_prefix(wrapped)
    check_finite_weights(path, wrapped)
    recorded_arch: str | None = raw.get("arch") if isinstance(raw.get("arch"), str) and raw.get("arch") else None
    named = arch or recorded_arch
    if state is not None and named and is_other_family(named):
        return _family_checkpoint(path, raw, named, state, weights)
    if state is None or "patch_embed.proj.weight" not in state:
        raise CheckpointError(f"{path}: not a ViT checkpoint (no {QKV_WEIGHT!r} or patch_embed weights found)")
    check_tensors(path, state)
    recorded = recorded_kwargs(path, raw)
    try:
        inferred = infer_vit_kwargs(state)
    except KeyError as exc:
        raise CheckpointError(f"{path}: unsupported ViT layout (missing {exc.args[0]!r})") from None
    except (IndexError, ValueError, ZeroDivisionError) as exc:
        raise CheckpointError(f"{path}: unsupported ViT layout ({exc})") from None
    heads = num_heads_of(path, inferred, recorded, recorded_arch, arch, num_heads)
    chosen_arch = named or (BASE_DISTILLED_ARCH if "dist_token" in state else BASE_ARCH)
    kwargs = {**inferred, **recorded}
    if heads is not None:
        kwargs["num_heads"] = heads
    meta = _metadata(path, raw)
    return Checkpoint(path, chosen_arch, kwargs, state, sha256_of(path), meta, weights,
                      data_config(path, raw, meta), training_lr(raw, meta))


def save_checkpoint(path: str | Path, arch: str, model_kwargs: dict[str, Any], state_dict: dict[str, Tensor],
                    metadata: dict[str, Any] | None = None, fmt: str = "pt") -> Path:
    """Write an isiwatch checkpoint atomically as a torch pickle of plain types or as safetensors.

    Both formats go through `atomic_write`'s file, so a full disk is reported as
    ``PATH: cannot write (No space left on device)`` (a `WriteError`) and leaves no file.
    """
    if fmt not in ("pt", "safetensors"):
        raise ValueError(f"unknown checkpoint format {fmt!r} (use 'pt' or 'safetensors')")
    path = Path(path)
    state = {k: v.detach().cpu().contiguous() for k, v in state_dict.items()}
    payload = {"arch": arch, "model_kwargs": model_kwargs, "isiwatch": metadata or {}}
    with atomic_write(path) as fh:
        if fmt == "safetensors":
            from safetensors.torch import save

            fh.write(save(state, metadata={"isiwatch": json.dumps(payload)}))
        else:
            torch.save({**payload, "state_dict": state}, fh)
    return path
