"""Hugging Face ``save_pretrained`` directories (``config.json`` + safetensors weights) as analysis inputs.

The model class is the one ``config.json`` names in ``architectures`` (else ``AutoModel``), loaded from the
directory alone (``local_files_only``, safetensors); the normalisation comes from
``preprocessor_config.json`` when the directory has one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._utils.files import WriteError
from .checkpoint import CheckpointError, check_finite_weights, sha256_of

#: Provenance record written next to a truncated model's config.json.
METADATA_FILE = "isiwatch.json"


def directory_sha256(path: Path) -> str:
    """One digest over the directory's config and weight files: the sha256 of each (`sha256_of`, streamed)
    with its name, in name order."""
    files = sorted(p for p in path.iterdir() if p.suffix in (".json", ".safetensors") and p.is_file())
    return hashlib.sha256("".join(f"{f.name}:{sha256_of(f)}\n" for f in files).encode()).hexdigest()


def _data_config(path: Path) -> dict[str, Any]:
    file = path / "preprocessor_config.json"
    if not file.is_file():
        return {}
    try:
        config = json.loads(file.read_text())
        mean, std = config["image_mean"], config["image_std"]
        # a transformers image processor resizes to the model's size, without a centre crop
        interpolation = {2: "bilinear", 3: "bicubic", 0: "nearest"}.get(config.get("resample", 2), "bilinear")
        return {"mean": tuple(float(v) for v in mean), "std": tuple(float(v) for v in std), "crop_pct": 1.0,
                "interpolation": interpolation, "source": "preprocessor_config.json"}
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{file}: no readable image_mean/image_std ({type(exc).__name__}: {exc})") from None


@contextlib.contextmanager
def _quiet_loading() -> Iterator[None]:
    """No "Loading weights" progress bar from transformers on the command line's stderr (restored after)."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # transformers leaves it untyped
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]  # same


def load_pretrained_dir(path: str | Path) -> tuple[nn.Module, dict[str, Any], dict[str, Any]]:
    """(model in eval mode, data config, model info) of a ``save_pretrained`` directory."""
    import transformers

    path = Path(path)
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path}: a directory without config.json (not a Hugging Face save_pretrained "
                              "directory)")
    try:
        config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{path}: not a readable transformers config ({str(exc).splitlines()[0]})") from None
    names = getattr(config, "architectures", None) or []
    cls = getattr(transformers, names[0], None) if names else None
    cls = cls if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel) else transformers.AutoModel
    try:
        with _quiet_loading():
            model = cls.from_pretrained(path, local_files_only=True, use_safetensors=True)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise CheckpointError(f"{path}: cannot load {cls.__name__} ({str(exc).splitlines()[0]})") from None
    check_finite_weights(path, model.state_dict())
    info = {"arch": type(model).__name__, "model_kwargs": {}, "checkpoint": str(path), "sha256": directory_sha256(path),
            "weights": "state_dict"}
    return model.eval(), _data_config(path), info


def save_pretrained_dir(model: nn.Module, out: str | Path, metadata: dict[str, Any]) -> Path:
    """Write ``model.save_pretrained`` (safetensors) and `METADATA_FILE` to the new directory ``out``: into a
    hidden sibling first, checked to reload into the model's own class with equal weights, then renamed into
    place, so a failure leaves nothing behind."""
    hf_model: Any = model  # a transformers PreTrainedModel
    out = Path(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with _quiet_loading():
            hf_model.save_pretrained(tmp, safe_serialization=True)
            (tmp / METADATA_FILE).write_text(json.dumps(metadata, indent=1) + "\n")
            reloaded = type(hf_model).from_pretrained(tmp, local_files_only=True).state_dict()
        saved = model.state_dict()
        if saved.keys() != reloaded.keys() or any(not torch.equal(saved[k].cpu(), reloaded[k]) for k in saved):
            raise CheckpointError(f"{out}: the written model does not reload into {type(model).__name__}")
        os.rename(tmp, out)
    except OSError as exc:
        raise WriteError(exc.errno, exc.strerror or str(exc), str(out)) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
