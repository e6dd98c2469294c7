"""Hierarchical vision transformers (Swin and the like) are declined: their blocks attend within local windows
and their stages merge patches, so there is no one token sequence whose per-layer scrambling, [CLS] or
plateau the metrics describe."""

from __future__ import annotations

from torch import nn

from .parts import TapError

#: Class names of hierarchical models in timm and transformers.
HIERARCHICAL = ("SwinTransformer", "SwinTransformerV2", "SwinTransformerV2Cr", "SwinModel", "Swinv2Model",
                "SwinForImageClassification", "Swinv2ForImageClassification", "MaxxVit", "PyramidVisionTransformerV2",
                "Twins", "MultiScaleVit", "Hiera", "DaViT", "NextViT", "EfficientFormer", "EfficientFormerV2")


def refuse(model: nn.Module) -> None:
    """Raise a one-line TapError for a hierarchical model; return None for anything else."""
    name = type(model).__name__
    if name in HIERARCHICAL:
        raise TapError(f"cannot tap {name}: hierarchical vision transformers (windowed attention, patch merging "
                       "between stages) are not supported; isiwatch reads plain ViTs with one token sequence")
