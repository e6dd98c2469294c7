"""What a checkpoint's mapping holds besides its file format: the timm model's state dict inside its wrappers
(EMA or not, ``module.``/``_orig_mod.``/Lightning prefixes), checks on its tensors, and the model keyword
arguments and data config the training run recorded."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

from .checkpoint_file import CheckpointError

QKV_WEIGHT = "blocks.0.attn.qkv.weight"
#: A first-block weight of every supported timm family (fused QKV, parallel blocks, separate q/k/v projections),
#: found to locate the model's entries inside a wrapper's state dict.
_FIRST_BLOCK_WEIGHTS = (QKV_WEIGHT, "blocks.0.in_proj.weight", "blocks.0.attns.0.attn.qkv.weight",
                        "blocks.0.attn.q_proj.weight")


def state_dict_of(raw: dict[str, Any], prefer_ema: bool) -> tuple[dict[str, Tensor], str]:
    """The state dict to load and which it is: "ema" or "state_dict" (any non-EMA one)."""
    for key in (("state_dict_ema", "state_dict") if prefer_ema else ("state_dict", "state_dict_ema")):
        if isinstance(raw.get(key), dict) and raw[key]:
            return raw[key], "ema" if key == "state_dict_ema" else "state_dict"
    for key in ("model", "model_state_dict", "module"):
        if isinstance(raw.get(key), dict):
            return raw[key], "state_dict"
    return raw, "state_dict"


#: ``train.py`` args that set the data config (``timm.data.resolve_data_config`` reads them).
DATA_ARGS = ("input_size", "img_size", "in_chans", "interpolation", "mean", "std", "crop_pct", "crop_mode")
#: ``train.py`` args of its train-time transform and the ``timm.data.create_transform`` parameters they set.
AUGMENT_ARGS = {"no_aug": "no_aug", "train_crop_mode": "train_crop_mode", "scale": "scale", "ratio": "ratio",
                "hflip": "hflip", "vflip": "vflip", "color_jitter": "color_jitter",
                "color_jitter_prob": "color_jitter_prob", "grayscale_prob": "grayscale_prob",
                "gaussian_blur_prob": "gaussian_blur_prob", "aa": "auto_augment", "reprob": "re_prob",
                "remode": "re_mode", "recount": "re_count", "train_interpolation": "interpolation"}

#: Normalisation sources whose statistics belong to the weights, so a checkpoint derived from them keeps them.
WEIGHT_SOURCES = ("checkpoint args", "checkpoint metadata", "--mean/--std")


def _stats(path: Path, name: str, value: object) -> tuple[float, ...]:
    values = value if isinstance(value, (list, tuple)) else (value,)
    numbers = tuple(float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool))
    if not values or len(numbers) != len(values):
        raise CheckpointError(f"{path}: the recorded {name} {value!r} is not a number or a list of numbers")
    return numbers


def data_config(path: Path, raw: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """The data config of the training run: timm ``train.py``'s ``args`` that set its preprocessing and train-time
    augmentation (`DATA_ARGS`, `AUGMENT_ARGS`; None or ''
    means "the model's default" there), with isiwatch's own recorded statistics when the args have none; a
    ``source`` names where ``mean``/``std`` came from."""
    args = raw.get("args")
    fields = vars(args) if isinstance(args, argparse.Namespace) else (args if isinstance(args, dict) else {})
    config: dict[str, Any] = {key: fields[key] for key in (*DATA_ARGS, *AUGMENT_ARGS)
                              if fields.get(key) is not None and fields.get(key) != ""}
    recorded = meta.get("normalization") if isinstance(meta, dict) else None
    source = "checkpoint args"
    if ("mean" not in config or "std" not in config) and isinstance(recorded, dict) \
            and recorded.get("source") in WEIGHT_SOURCES:
        config.update({key: recorded[key] for key in DATA_ARGS if recorded.get(key) is not None})
        source = "checkpoint metadata"
    if "mean" in config and "std" in config:
        config.update(mean=_stats(path, "mean", config["mean"]), std=_stats(path, "std", config["std"]),
                      source=source)
    else:
        config.pop("mean", None), config.pop("std", None)
    if not isinstance(config.get("interpolation", ""), str):
        config.pop("interpolation")
    if isinstance(config.get("crop_pct"), bool) or not isinstance(config.get("crop_pct", 0.0), (int, float)):
        config.pop("crop_pct")
    return config


def training_lr(raw: dict[str, Any], meta: dict[str, Any]) -> float | None:
    """The peak learning rate the weights were trained at, as recorded: isiwatch's own ``lr`` (a fine-tune's
    pretrained blocks), else timm ``train.py``'s ``args.lr``; None when neither records a positive number."""
    args = raw.get("args")
    fields = vars(args) if isinstance(args, argparse.Namespace) else (args if isinstance(args, dict) else {})
    for value in (meta.get("lr"), fields.get("lr")):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf"):
            return float(value)
    return None


def strip_prefix(state: dict[str, Tensor]) -> dict[str, Tensor] | None:
    """The timm model's entries without the wrapper prefix around them (``module.``, ``_orig_mod.``,
    Lightning's ``model.``, or several), found where the first block's QKV weight sits and removed with torch's
    ``consume_prefix_in_state_dict_if_present``; entries outside the prefix (a Lightning module's other parts)
    are dropped. None when no first-block weight is found."""
    prefix = next((k[: -len(anchor)] for k in state for anchor in _FIRST_BLOCK_WEIGHTS
                   if isinstance(k, str) and k.endswith(anchor)), None)
    if prefix is None:
        return None
    model = {k: v for k, v in state.items() if isinstance(k, str) and k.startswith(prefix)}
    consume_prefix_in_state_dict_if_present(model, prefix)
    return model


#: Dimensions of the tensors whose shapes `infer_vit_kwargs` reads.
_NDIM = {"patch_embed.proj.weight": 4, "blocks.0.mlp.fc1.weight": 2, "head.weight": 2, "pos_embed": 3,
         "cls_token": 3, "reg_token": 3, "dist_token": 3}


def check_tensors(path: Path, state: dict[str, Tensor]) -> None:
    """Refuse entries that are no tensors and tensors of the wrong rank before any shape is read."""
    for key, value in state.items():
        if not isinstance(value, Tensor):
            raise CheckpointError(f"{path}: state dict entry {key!r} is not a tensor ({type(value).__name__})")
    for key, ndim in _NDIM.items():
        if key in state and state[key].dim() != ndim:
            raise CheckpointError(f"{path}: {key!r} has shape {tuple(state[key].shape)}; a ViT's has {ndim} "
                                  "dimensions")


def check_finite_weights(path: Path, state: Mapping[str, object]) -> None:
    """Refuse weights holding NaN or Inf (a diverged run's or a corrupted file's): every curve, probe and cut of such
    a model is meaningless, so it is named in one line instead of being analysed, cut or specialised."""
    bad = [key for key, value in state.items()
           if isinstance(value, Tensor) and value.is_floating_point() and not bool(torch.isfinite(value).all())]
    if bad:
        raise CheckpointError(f"{path}: {len(bad)} weight tensor{' holds' if len(bad) == 1 else 's hold'} NaN or Inf "
                              f"(first: {bad[0]!r}); a diverged or corrupted checkpoint cannot be used")


def recorded_kwargs(path: Path, raw: dict[str, Any]) -> dict[str, Any]:
    """The model keyword arguments the checkpoint records: its own ``model_kwargs`` over timm ``train.py``'s
    ``args.model_kwargs``."""
    args = raw.get("args")
    from_args = getattr(args, "model_kwargs", None) if isinstance(args, argparse.Namespace) else (
        args.get("model_kwargs") if isinstance(args, dict) else None)
    recorded: dict[str, Any] = {}
    for name, value in (("args.model_kwargs", from_args), ("model_kwargs", raw.get("model_kwargs"))):
        if value is not None and not isinstance(value, dict):
            raise CheckpointError(f"{path}: {name} is not a mapping ({type(value).__name__})")
        recorded.update(value or {})
    heads = recorded.get("num_heads")
    if heads is not None and (isinstance(heads, bool) or not isinstance(heads, int) or heads < 1):
        raise CheckpointError(f"{path}: the recorded num_heads {heads!r} is not a positive integer")
    return recorded
