"""A checkpoint's timm architecture: the ``VisionTransformer`` keyword arguments its tensor shapes imply, timm's
default config of a named architecture, the head count (which no shape holds), and whether a name is a ViT family
other than the plain VisionTransformer."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .checkpoint_file import CheckpointError, CheckpointOptionError

#: timm model used as the template when a checkpoint names no architecture.
BASE_ARCH = "vit_tiny_patch16_224"
BASE_DISTILLED_ARCH = "deit_tiny_distilled_patch16_224"


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
def is_other_family(name: str) -> bool:
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


def num_heads_of(path: Path, inferred: Mapping[str, Any], recorded: Mapping[str, Any], recorded_arch: str | None,
                 arch: str | None, num_heads: int | None) -> int | None:
    """The head count of the checkpoint at ``path``, whose tensors imply ``inferred`` (`infer_vit_kwargs`) and which
    records ``recorded`` model keyword arguments and ``recorded_arch``: ``num_heads``, the recorded one, or the
    default config's of ``arch`` or (at this width) of the recorded arch. None when the recorded arch names no
    timm ViT (building it names the problem). A head count that the options and the checkpoint contradict, or that
    none of them gives, is refused."""
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
    if heads is not None and dim % heads:
        raise CheckpointError(f"{path}: num_heads {heads} does not divide the embed_dim {dim} of its tensors")
    return heads
