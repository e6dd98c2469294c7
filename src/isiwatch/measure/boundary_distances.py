"""Distances between the residual stream at every pair of block boundaries, and the two baseline
block-importance scores from the LLM depth-pruning literature that read them.

Both scores work on the residual stream at block boundaries, ``hidden[ℓ]`` = input of block ℓ (ℓ < L) and
``hidden[L]`` = output of the last block, over all tokens of a few images:

- ShortGPT block influence (Men et al., 2024): ``BI_ℓ = 1 − cos(hidden[ℓ], hidden[ℓ+1])``; the blocks that
  turn their input least are the least important.
- Angular distance (Gromov et al., 2024, "The Unreasonable Ineffectiveness of the Deeper Layers"):
  ``d(ℓ, n) = arccos(cos(hidden[ℓ], hidden[ℓ+n])) / π``; drop the n consecutive blocks ℓ..ℓ+n−1 whose
  input and output are closest. The LLM papers use the last token; a ViT has no causal last token, so
  every token (prefix and patches) counts equally here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..taps import preserved_state, vit_parts


@dataclass
class BoundaryDistances:
    """Mean per-token distances between every pair of block boundaries, each (L+1, L+1).

    ``cosine[i, j]``: mean cos(hidden[i], hidden[j]); ``angle[i, j]``: mean arccos(cos)/π, in [0, 1].
    """

    cosine: Tensor
    angle: Tensor

    @property
    def depth(self) -> int:
        return len(self.cosine) - 1


@torch.no_grad()
def boundary_distances(model: nn.Module, images: Tensor, batch_size: int = 64) -> BoundaryDistances:
    """Distances between the residual streams at all block boundaries of ``model`` on ``images``.

    Runs in eval mode (modes and RNG are restored); only one chunk's boundaries are held at a time, so
    memory is (L+1)·batch_size·T·D floats whatever the number of images.
    """
    if len(images) == 0:
        raise ValueError("boundary_distances needs at least one image")
    parts = vit_parts(model)
    blocks = [bp.block for bp in parts.blocks[:parts.droppable]]
    param = next(model.parameters())
    n = len(blocks) + 1
    cos_sum = torch.zeros(n, n, dtype=torch.float64)
    angle_sum = torch.zeros(n, n, dtype=torch.float64)
    tokens = 0
    current: list[Tensor] = []
    handles = [b.register_forward_pre_hook(lambda _m, args: current.append(args[0].float())) for b in blocks]
    handles.append(blocks[-1].register_forward_hook(lambda _m, _a, out: current.append(out.float())))
    try:
        with preserved_state(model):
            model.eval()
            for i in range(0, len(images), batch_size):
                current.clear()
                model(images[i:i + batch_size].to(param.device, param.dtype))
                unit = F.normalize(torch.stack(current).flatten(1, 2), dim=-1)  # (L+1, B·T, D)
                cos = torch.einsum("imd,jmd->ijm", unit, unit).clamp(-1, 1)
                cos_sum += cos.sum(-1).double().cpu()
                angle_sum += (torch.arccos(cos) / torch.pi).sum(-1).double().cpu()
                tokens += cos.shape[-1]
    finally:
        for h in handles:
            h.remove()
    return BoundaryDistances(cos_sum / tokens, angle_sum / tokens)


def block_influence(dist: BoundaryDistances) -> Tensor:
    """ShortGPT block influence, one value per block (L,): mean over tokens of 1 − cos(input, output)."""
    return 1 - dist.cosine.diagonal(1)


def angular_distance(dist: BoundaryDistances, span: int) -> Tensor:
    """Gromov angular distance from the input of block ℓ to the output of block ℓ+span−1, for every start ℓ
    (L−span+1,), in [0, 1]."""
    if not 1 <= span <= dist.depth:
        raise ValueError(f"span must be between 1 and the depth {dist.depth}, got {span}")
    return dist.angle.diagonal(span)
