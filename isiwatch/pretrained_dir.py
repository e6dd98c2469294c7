"""Hugging Face ``save_pretrained`` directories (``config.json`` + safetensors weights) as analysis inputs.

The model class is the one ``config.json`` names in ``architectures`` (else ``AutoModel``), loaded from the
directory alone (``local_files_only``, safetensors); the normalisation comes from
``preprocessor_config.json`` when the directory has one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from torch import nn

from .checkpoint import CheckpointError


def directory_sha256(path: Path) -> str:
    """One digest over the directory's config and weight files, in name order."""
    digest = hashlib.sha256()
    for file in sorted(p for p in path.iterdir() if p.suffix in (".json", ".safetensors") and p.is_file()):
        digest.update(file.name.encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()


def _data_config(path: Path) -> dict:
    file = path / "preprocessor_config.json"
    if not file.is_file():
        return {}
    try:
        config = json.loads(file.read_text())
        mean, std = config["image_mean"], config["image_std"]
        return {"mean": tuple(float(v) for v in mean), "std": tuple(float(v) for v in std),
                "source": "preprocessor_config.json"}
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{file}: no readable image_mean/image_std ({type(exc).__name__}: {exc})") from None


def load_pretrained_dir(path: str | Path) -> tuple[nn.Module, dict, dict]:
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
        model = cls.from_pretrained(path, local_files_only=True, use_safetensors=True)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise CheckpointError(f"{path}: cannot load {cls.__name__} ({str(exc).splitlines()[0]})") from None
    info = {"arch": type(model).__name__, "model_kwargs": {}, "checkpoint": str(path), "sha256": directory_sha256(path),
            "weights": "state_dict"}
    return model.eval(), _data_config(path), info
