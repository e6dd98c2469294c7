"""Hugging Face CLIP and SigLIP vision towers (``CLIPVisionModel``, ``SiglipVisionModel``, and the vision half of
``CLIPModel`` / ``SiglipModel``).

Pre-norm layers: norm1(X) is ``layer_norm1``, Y = X + ``self_attn`` output. CLIP has a [CLS] (its
``class_embedding``) and normalises the embeddings (``pre_layrnorm``) before the first layer, so X₀ is
normalised; SigLIP has no [CLS] (an attention-pooling head reads the patches), so the [CLS] metrics and
probe are not reported. The patch embedding E is the patch convolution's output.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .hf_vit import layer_list
from .parts import BlockParts, ViTParts, branch_output, channels_first_tokens, defined_in


def parts(model: nn.Module) -> ViTParts | None:
    if not defined_in(model, "transformers"):
        return None
    embeddings: Any = getattr(model, "embeddings", None)  # transformers objects: read by attribute
    layers = layer_list(model)
    if layers is None or not isinstance(getattr(embeddings, "patch_embedding", None), nn.Conv2d):
        return None
    has_cls = getattr(embeddings, "class_embedding", None) is not None
    p = int(has_cls)
    blocks = []
    layer: Any
    for layer in layers:
        if not (hasattr(layer, "layer_norm1") and hasattr(layer, "self_attn")):
            return None
        blocks.append(BlockParts(layer, (layer.self_attn,), ((layer.self_attn, branch_output),), layer.layer_norm1,
                                 p, has_cls))
    return ViTParts("transformers", blocks, embeddings.patch_embedding, p, has_cls, channels_first_tokens)
