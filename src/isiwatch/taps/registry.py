"""Which family adapter describes a model. The next family is one new module with a ``parts(model)`` function
(a `ViTParts`, or None when the model is not of that family) added to `ADAPTERS`."""

from __future__ import annotations

from torch import nn

from . import hf_clip, hf_vit, hierarchical, timm_beit, timm_cait, timm_eva, timm_vit
from .parts import TapError, ViTParts, unwrap_model

#: Family adapters, tried in order on the model and then on each of its submodules.
ADAPTERS = (timm_vit.parts, timm_eva.parts, timm_beit.parts, timm_cait.parts, hf_vit.parts, hf_clip.parts)


def vit_parts(model: nn.Module) -> ViTParts:
    """Locate the blocks, patch embedding and prefix tokens of a supported ViT (the model itself or a submodule,
    e.g. the network inside a LightningModule or the vision tower of a CLIP model)."""
    model = unwrap_model(model)
    for module in model.modules():
        hierarchical.refuse(module)
        for adapter in ADAPTERS:
            found = adapter(module)
            if found is not None:
                return found
    raise TapError(
        f"cannot tap {type(model).__name__}: no list of ViT blocks found (supported: timm ViT/DeiT/relpos/"
        "NaFlexViT, EVA, BEiT, CaiT; transformers ViT/DeiT/BEiT/DINOv2/CLIP/SigLIP vision); "
        "use isiwatch.taps.custom_parts() for other models"
    )
