"""Model taps: find a ViT's blocks and hand each block's tensors to a consumer on one probe pass.

One adapter module per family (``timm_vit``, ``timm_eva``, ``timm_beit``, ``timm_cait``, ``hf_vit``,
``hf_clip``) says where each block's X, norm1(X), attention branch, attention scores and output Z come from
and documents what they mean for that family; `isiwatch.taps.registry` picks the adapter, `isiwatch.taps.tap` runs the
pass.
"""

from .attention import AttentionScores
from .parts import BlockParts, TapError, ViTParts, custom_parts, input_problem, unwrap_model
from .registry import vit_parts
from .tap import BlockTensors, Tap, preserved_state

__all__ = ["AttentionScores", "BlockParts", "BlockTensors", "Tap", "TapError", "ViTParts", "custom_parts",
           "input_problem", "preserved_state", "unwrap_model", "vit_parts"]
