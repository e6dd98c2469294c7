"""Images for a given model: the normalisation its weights were trained with, and labelled images (the embedded
digits or an ImageFolder) fitted to its input size and channels and normalised that way."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from .data import (
    INTERPOLATIONS,
    MNIST_NORMALIZATION,
    DataError,
    DataOptionError,
    Normalization,
    fit_to_model,
    held_out_digits,
    image_folder,
    per_channel,
    renormalize,
)


def model_input(model: nn.Module) -> tuple[tuple[int, int], int]:
    """(image size (H, W), channels) a model takes: timm's patch embedding; NaFlexViT's positional grid × patch
    size; a transformers config's ``image_size`` / ``num_channels``."""
    embed = getattr(model, "patch_embed", None)
    if embed is not None and getattr(embed, "img_size", None) is not None:
        return tuple(embed.img_size), embed.proj.in_channels
    embeds = getattr(model, "embeds", None)  # NaFlexViT
    if embeds is not None and hasattr(embeds, "pos_embed_grid_size"):
        (gh, gw), (ph, pw) = embeds.pos_embed_grid_size, embeds.patch_size
        return (gh * ph, gw * pw), embeds.in_chans
    config: Any = getattr(model, "config", None)  # a transformers config
    config = getattr(config, "vision_config", config)  # CLIP/SigLIP classifiers: the vision tower's config
    if isinstance(getattr(config, "image_size", None), (int, list, tuple)):
        size = config.image_size
        return ((size, size) if isinstance(size, int) else tuple(size)), int(config.num_channels)
    raise DataError(f"cannot tell the input size of {type(model).__name__}")


def resolve_normalization(model: nn.Module, data: str, data_config: dict[str, Any] | None = None,
                          mean: tuple[float, ...] | None = None, std: tuple[float, ...] | None = None
                          ) -> Normalization:
    """How images for ``model`` are normalised: ``mean``/``std`` given by the user; else MNIST statistics for
    the embedded digits; else the statistics the weights were trained with (``data_config``, see
    :attr:`~isiwatch.io.checkpoint.Checkpoint.data_config`); else the model's ``pretrained_cfg`` (3 channels) or
    MNIST statistics (other channel counts)."""
    _, in_chans = model_input(model)
    config = data_config or {}
    interpolation = config["interpolation"] if config.get("interpolation") in INTERPOLATIONS else "bilinear"
    if (mean is None) != (std is None):
        raise DataOptionError("{mean} and {std} go together: give both or neither")
    if mean is not None and std is not None:  # both or neither, checked above
        return Normalization(per_channel(mean, in_chans, "mean"), per_channel(std, in_chans, "std"),
                             "--mean/--std", interpolation)
    if data == "mnist":
        return MNIST_NORMALIZATION
    if config:
        return Normalization(per_channel(config["mean"], in_chans, f"the {config['source']} mean"),
                             per_channel(config["std"], in_chans, f"the {config['source']} std"),
                             config["source"], interpolation)
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    if in_chans == 3 and cfg.get("mean") and cfg.get("std"):
        return Normalization(tuple(cfg["mean"]), tuple(cfg["std"]), "pretrained_cfg")
    return Normalization(MNIST_NORMALIZATION.mean * in_chans, MNIST_NORMALIZATION.std * in_chans, "mnist")


def probe_images(model: nn.Module, data: str, count: int | None,
                 norm: Normalization | None = None) -> tuple[Tensor, Tensor]:
    """``count`` labelled images for ``model``: 'mnist' = the embedded held-out digits, else an ImageFolder;
    normalised with ``norm`` (default: :func:`resolve_normalization` without a checkpoint's data config)."""
    img_size, in_chans = model_input(model)
    norm = norm or resolve_normalization(model, data)
    if data == "mnist":
        images, labels = held_out_digits(count)
        return renormalize(fit_to_model(images, img_size, in_chans), norm), labels
    return image_folder(data, img_size, in_chans, per_channel(norm.mean, in_chans, "mean"),
                        per_channel(norm.std, in_chans, "std"), limit=count, interpolation=norm.interpolation)
