"""A checkpoint file's top-level mapping, read without running any code, and the errors a bad checkpoint raises.

Reads torch pickles (timm ``train.py``'s, isiwatch's own, plain state dicts), Lightning ``.ckpt`` files and
safetensors. Pickles load with ``weights_only=True``: a pickle that would run code is refused, never executed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .._utils.files import PathError, check_input
from .._utils.option_error import OptionError


class CheckpointError(ValueError):
    """A checkpoint cannot be read or is not a ViT; the message names the file and the problem."""


class CheckpointOptionError(OptionError, CheckpointError):
    """A checkpoint that contradicts an option (``arch``, ``num_heads``), named as the caller knows it: a Python
    parameter (``arch=NAME``), or a flag (``--arch NAME``) from the command line."""



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
