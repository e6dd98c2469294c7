"""The input a model takes: image size and channels, read from the model itself."""

from __future__ import annotations

from typing import Any

from torch import nn

from .data import DataError


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
