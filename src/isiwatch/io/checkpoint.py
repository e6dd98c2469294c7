"""Safe checkpoint reading and writing, and timm architecture inference from tensor shapes.

Reads what timm's ``train.py`` writes (``arch``, ``args`` with ``model_kwargs``, ``state_dict`` and
``state_dict_ema``), isiwatch's own files (``arch``, ``model_kwargs``, ``state_dict``), plain state
dicts, Lightning ``.ckpt`` files and safetensors. Pickles load with ``weights_only=True``: a pickle that
would run code is refused, never executed.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

from .._utils.files import PathError, atomic_write, check_input
from .._utils.option_error import OptionError

#: timm model used as the template when a checkpoint names no architecture.
BASE_ARCH = "vit_tiny_patch16_224"
BASE_DISTILLED_ARCH = "deit_tiny_distilled_patch16_224"
_QKV = "blocks.0.attn.qkv.weight"
#: A first-block weight of every supported timm family (fused QKV, parallel blocks, separate q/k/v projections),
#: found to locate the model's entries inside a wrapper's state dict.
_FIRST_BLOCK_WEIGHTS = (_QKV, "blocks.0.in_proj.weight", "blocks.0.attns.0.attn.qkv.weight",
                        "blocks.0.attn.q_proj.weight")


class CheckpointError(ValueError):
    """A checkpoint cannot be read or is not a ViT; the message names the file and the problem."""


class CheckpointOptionError(OptionError, CheckpointError):
    """A checkpoint that contradicts an option (``arch``, ``num_heads``), named as the caller knows it: a Python
    parameter (``arch=NAME``), or a flag (``--arch NAME``) from the command line."""


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


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_raw(path: str | Path) -> dict[str, Any]:
    """The checkpoint's top-level mapping, read without running any code."""
    path = Path(path)
    try:
        check_input(path, kind="checkpoint file", directory=False)  # /dev/null or a FIFO: said so, never read
    except PathError as exc:
        raise CheckpointError(str(exc)) from None
    with open(path, "rb") as fh:
        head = fh.read(16)
    if len(head) == 0:
        raise CheckpointError(f"{path}: file is empty")
    if path.suffix == ".safetensors" or (len(head) >= 9 and head[8:9] == b"{"):
        return _read_safetensors(path)
    try:
        with torch.serialization.safe_globals([argparse.Namespace]), warnings.catch_warnings():
            # a foreign (legacy, protocol > 2) pickle: torch warns before refusing or reading it; the outcome is
            # what counts, and a CLI error must stay one line
            warnings.filterwarnings("ignore", "Detected pickle protocol", UserWarning)
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        unsafe = _unsafe_globals(path)
        if not unsafe:
            raise CheckpointError(f"{path}: not a readable torch or safetensors checkpoint") from None
        obj = _read_lightning(path, unsafe)
        if obj is None:
            raise CheckpointError(
                f"{path}: refusing to load: the pickle calls {', '.join(unsafe)}, which safe (weights_only) "
                "loading does not allow") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a dict of tensors, found {type(obj).__name__}")
    return obj


class _Inert:
    """Stand-in for every global a pickle names outside the allowlist: constructed from anything, does nothing.

    The named class or function is never imported or called, so loading stays as safe as ``weights_only``.
    """

    def __new__(cls, *args: object, **kwargs: object) -> _Inert:
        return super().__new__(cls)

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __setstate__(self, state: object) -> None:
        pass


def _unsafe_globals(path: Path) -> list[str]:
    """The globals the pickle names that safe (``weights_only``) loading refuses, as torch.serialization lists
    them; empty when there are none or the file is no torch checkpoint at all."""
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # not a zip-format torch file: nothing to list
        return []


def _read_lightning(path: Path, names: list[str]) -> dict[str, Any] | None:
    """The ``state_dict`` of a Lightning checkpoint whose ``hyper_parameters``/``callbacks`` hold types that
    ``weights_only`` refuses (paths, enums, config classes; ``names``): those load as inert stand-ins and are
    dropped. None when the file is no Lightning checkpoint or its state dict itself holds such objects."""
    try:
        with torch.serialization.safe_globals([argparse.Namespace, *((_Inert, name) for name in names)]):
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        return None
    if not isinstance(obj, dict) or "pytorch-lightning_version" not in obj:
        return None
    state = obj.get("state_dict")
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        return None
    return {"state_dict": state}


def _read_safetensors(path: Path) -> dict[str, Any]:
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
    raw: dict[str, Any] = {"state_dict": state}
    if "isiwatch" in meta:
        try:
            recorded = json.loads(meta["isiwatch"])
        except json.JSONDecodeError:
            recorded = None
        if not isinstance(recorded, dict):
            raise CheckpointError(f"{path}: its 'isiwatch' metadata is not a JSON object")
        raw.update(recorded)
    return raw


def _state_dict_of(raw: dict[str, Any], prefer_ema: bool) -> tuple[dict[str, Tensor], str]:
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


def _data_config(path: Path, raw: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
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


def _strip_prefix(state: dict[str, Tensor]) -> dict[str, Tensor] | None:
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


def _check_tensors(path: Path, state: dict[str, Tensor]) -> None:
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


def _recorded_kwargs(path: Path, raw: dict[str, Any]) -> dict[str, Any]:
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


def _is_square(n: int) -> int | None:
    root = math.isqrt(n) if n > 0 else 0
    return root if root * root == n else None


def infer_vit_kwargs(state: dict[str, Tensor]) -> dict[str, Any]:
    """timm ``VisionTransformer`` keyword arguments implied by the tensor shapes of ``state``."""
    proj = state["patch_embed.proj.weight"]
    dim, in_chans, patch = proj.shape[0], proj.shape[1], proj.shape[2]
    depth = 1 + max(int(m.group(1)) for k in state if (m := re.match(r"blocks\.(\d+)\.", k)))
    has_cls = "cls_token" in state
    prefix = int(has_cls) + ("dist_token" in state) + (state["reg_token"].shape[1] if "reg_token" in state else 0)
    kwargs: dict[str, Any] = {"embed_dim": dim, "depth": depth, "patch_size": patch, "in_chans": in_chans,
                              "num_classes": state["head.weight"].shape[0] if "head.weight" in state else 0,
                              "mlp_ratio": state["blocks.0.mlp.fc1.weight"].shape[0] / dim,
                              "qkv_bias": "blocks.0.attn.qkv.bias" in state,
                              "qk_norm": "blocks.0.attn.q_norm.weight" in state,
                              "init_values": 1e-5 if "blocks.0.ls1.gamma" in state else None}
    if "dist_token" not in state:
        kwargs["class_token"] = has_cls
        kwargs["reg_tokens"] = prefix - int(has_cls)
        kwargs["global_pool"] = ("map" if "attn_pool.latent" in state else
                                 "token" if has_cls and "fc_norm.weight" not in state else "avg")
        kwargs["fc_norm"] = "fc_norm.weight" in state
        kwargs["final_norm"] = "norm.weight" in state or "fc_norm.weight" in state
    if "pos_embed" in state:
        length = state["pos_embed"].shape[1]
        grid = _is_square(length - prefix) if has_cls or prefix else None
        if grid is not None and "dist_token" not in state:
            kwargs["no_embed_class"] = False
        elif _is_square(length) is not None:
            grid = _is_square(length)
            kwargs["no_embed_class"] = True
        if grid:
            kwargs["img_size"] = grid * patch
    return kwargs


#: The architecture numbers an ``--arch`` must agree on with a checkpoint (the head count changes no shape).
_ARCH_KEYS = ("embed_dim", "depth", "patch_size", "num_heads")


@functools.lru_cache(maxsize=64)
def _default_config(name: str) -> dict[str, int] | str:
    """``embed_dim``, ``depth``, ``patch_size`` and ``num_heads`` of timm's default config for ``name`` (built on
    the meta device: no memory, no weights), or a string saying why there are none."""
    import timm

    try:
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False)
    except Exception:  # unknown names raise RuntimeError; a model whose init needs real tensors: build it on the CPU
        try:
            model = timm.create_model(name, pretrained=False)
        except Exception as exc:
            return f"cannot build timm model {name!r}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    proj = getattr(getattr(model, "patch_embed", None), "proj", None)
    blocks = getattr(model, "blocks", None) or ()
    heads = getattr(getattr(blocks[0], "attn", None), "num_heads", None) if blocks else None
    if not isinstance(proj, nn.Conv2d) or not isinstance(heads, int):
        return f"{name!r} is not a ViT architecture"
    return {"embed_dim": proj.out_channels, "depth": len(blocks), "patch_size": proj.kernel_size[0],
            "num_heads": heads}


def arch_config(name: str) -> dict[str, int] | None:
    """The `_ARCH_KEYS` of timm's default config for ``name``; None when it names no timm ViT."""
    config = _default_config(name)
    return dict(config) if isinstance(config, dict) else None


def _described(config: Mapping[str, int], recorded: Mapping[str, Any]) -> dict[str, Any]:
    """What ``timm.create_model(name, **recorded)`` would have, for the `_ARCH_KEYS`, from ``config``
    (``name``'s `arch_config`)."""
    described: dict[str, Any] = dict(config)
    for key in _ARCH_KEYS:
        value = recorded.get(key)
        if value is not None:
            described[key] = value[0] if key == "patch_size" and isinstance(value, (tuple, list)) else value
    return described


def _mismatch(claim: Mapping[str, object], actual: Mapping[str, object]) -> tuple[str, str] | None:
    """The `_ARCH_KEYS` on which ``claim`` and ``actual`` differ, as two lists, or None."""
    keys = [key for key in _ARCH_KEYS if actual.get(key) is not None and claim[key] != actual[key]]
    if not keys:
        return None
    return ", ".join(f"{key} {claim[key]}" for key in keys), ", ".join(f"{key} {actual[key]}" for key in keys)


@functools.lru_cache(maxsize=64)
def _is_other_family(name: str) -> bool:
    """Whether timm's ``name`` is a ViT the taps read (EVA, BEiT, CaiT, relpos, NaFlexViT, parallel blocks…) other
    than a VisionTransformer of plain pre-norm Blocks, whose keyword arguments the tensor shapes imply
    (`infer_vit_kwargs`). Unknown names and non-ViTs are not, so that the usual path names the problem."""
    import timm
    from timm.models.vision_transformer import Block, VisionTransformer

    from ..taps import TapError, vit_parts

    try:
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False)
    except Exception:  # a model whose init needs real tensors: build it on the CPU
        try:
            model = timm.create_model(name, pretrained=False)
        except Exception:
            return False
    if isinstance(model, VisionTransformer) and all(type(b) is Block for b in model.blocks):
        return False
    try:
        vit_parts(model)
    except TapError:
        return False
    return True


def _family_checkpoint(path: Path, raw: dict[str, Any], arch: str, state: dict[str, Tensor],
                       weights: str) -> Checkpoint:
    """A checkpoint of another timm ViT family: its recorded keyword arguments, with the class count and input
    channels read from the head and patch-embedding tensors when it records none; the strict load checks the rest."""
    _check_tensors(path, state)
    kwargs = _recorded_kwargs(path, raw)
    head, proj = state.get("head.weight"), state.get("patch_embed.proj.weight", state.get("embeds.proj.weight"))
    if head is not None and head.dim() == 2:
        kwargs.setdefault("num_classes", head.shape[0])
    if proj is not None and proj.dim() == 4:
        kwargs.setdefault("in_chans", proj.shape[1])
    meta = raw.get("isiwatch") or {}
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: its 'isiwatch' record is not a mapping ({type(meta).__name__})")
    return Checkpoint(path, arch, kwargs, state, sha256_of(path), meta, weights, _data_config(path, raw, meta))


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
    wrapped, weights = _state_dict_of(raw, prefer_ema)
    state = _strip_prefix(wrapped)
    check_finite_weights(path, wrapped)
    recorded_arch: str | None = raw.get("arch") if isinstance(raw.get("arch"), str) and raw.get("arch") else None
    named = arch or recorded_arch
    if state is not None and named and _is_other_family(named):
        return _family_checkpoint(path, raw, named, state, weights)
    if state is None or "patch_embed.proj.weight" not in state:
        raise CheckpointError(f"{path}: not a ViT checkpoint (no {_QKV!r} or patch_embed weights found)")
    _check_tensors(path, state)
    recorded = _recorded_kwargs(path, raw)
    try:
        inferred = infer_vit_kwargs(state)
    except KeyError as exc:
        raise CheckpointError(f"{path}: unsupported ViT layout (missing {exc.args[0]!r})") from None
    except (IndexError, ValueError, ZeroDivisionError) as exc:
        raise CheckpointError(f"{path}: unsupported ViT layout ({exc})") from None
    dim = inferred["embed_dim"]
    if num_heads is not None:
        if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1 or dim % num_heads:
            raise CheckpointOptionError("{path}: {num_heads} {heads} does not divide the embed_dim {dim} of its "
                                        "tensors", path=path, heads=num_heads, dim=dim)
        if recorded.get("num_heads") not in (None, num_heads):
            raise CheckpointOptionError("{path}: {num_heads} {heads} contradicts the checkpoint, which records "
                                        "num_heads {recorded}", path=path, heads=num_heads,
                                        recorded=recorded["num_heads"])
    actual = {key: inferred[key] for key in _ARCH_KEYS[:3]}
    # the head count as the checkpoint itself says it: recorded, given, or the recorded arch's (at this width)
    given = num_heads or recorded.get("num_heads")
    heads = given
    recorded_default = arch_config(recorded_arch) if recorded_arch else None
    recorded_config = _described(recorded_default, recorded) if recorded_default is not None else None
    if heads is None and recorded_config is not None and recorded_config["embed_dim"] == dim:
        heads = recorded_config["num_heads"]
    if arch and arch != recorded_arch:
        default = arch_config(arch)
        if default is None:
            raise CheckpointOptionError("{path}: {arch} {problem}", path=path, problem=_default_config(arch))
        claim = _described(default, {**recorded, "num_heads": given})
        diff = _mismatch(default, recorded_default) if recorded_default is not None else None
        if diff:  # another family than the one recorded (equal defaults, e.g. vit_/deit_ aliases, are fine)
            raise CheckpointOptionError("{path}: {arch} {name!r} ({ours}) contradicts the checkpoint's recorded arch "
                                        "{recorded!r} ({theirs})", path=path, name=arch, ours=diff[0],
                                        recorded=recorded_arch, theirs=diff[1])
        diff = _mismatch(claim, {**actual, "num_heads": heads})
        if diff:
            raise CheckpointOptionError("{path}: {arch} {name!r} ({ours}) contradicts the checkpoint's tensors "
                                        "({theirs})", path=path, name=arch, ours=diff[0], theirs=diff[1])
        heads = claim["num_heads"]
    elif heads is None and not (recorded_arch and recorded_config is None):  # else build() names the bad arch
        if recorded_config is not None:
            reason = (f"records arch {recorded_arch!r} (embed_dim {recorded_config['embed_dim']}) but its tensors "
                      f"have embed_dim {dim}, and no num_heads")
        else:
            reason = "records no architecture and no num_heads"
        raise CheckpointOptionError("{path}: the checkpoint {reason}, and the head count is not in the tensors; "
                                    "pass {arch:NAME} (a timm name whose default config has it) or {num_heads:N}",
                                    path=path, reason=reason)
    chosen_arch = named or (BASE_DISTILLED_ARCH if "dist_token" in state else BASE_ARCH)
    kwargs = {**inferred, **recorded}
    if heads is not None:
        if dim % heads:
            raise CheckpointError(f"{path}: num_heads {heads} does not divide the embed_dim {dim} of its tensors")
        kwargs["num_heads"] = heads
    meta = raw.get("isiwatch") or {}
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: its 'isiwatch' record is not a mapping ({type(meta).__name__})")
    return Checkpoint(path, chosen_arch, kwargs, state, sha256_of(path), meta, weights,
                      _data_config(path, raw, meta))


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
