"""The linear bridge (`isiwatch.truncation.bridge`): merged into ``fc2`` it computes what the explicit bridge
computes (the kept block's MLP branch ``m`` replaced by ``m·A + c``, by hooks on the unmerged cut), in every
family the project covers; families where it cannot merge are refused in one line."""

import pytest
import torch
from test_families import HF, TIMM, make_hf, make_timm
from torch import Tensor, nn

from isiwatch.truncation.bridge import _activations, _fit_lstsq, bridge_cut, dropped_runs, mlp_branch
from isiwatch.truncation.classifier_layout import block_list
from isiwatch.truncation.surgery import cut_vit

#: Families whose blocks have no MLP output projection to merge into, or add it after a norm (post-norm).
REFUSED = {"parallel_scaling", "parallel_things", "diff_parallel_fused_proj", "relpos_res_post"}


def output(model: nn.Module, x: Tensor) -> Tensor:
    out = model(x)
    if isinstance(out, Tensor):
        return out
    return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


def explicit(uncut: nn.Module, kept: list[int], images: Tensor) -> nn.Module:
    """The cut with the bridge as a hook after its kept block: ``h − m + m·A + c`` (no weight changed)."""
    cut = cut_vit(uncut, kept)
    (after, dropped), = dropped_runs(kept, len(block_list(uncut)))
    position = kept.index(after)
    block = block_list(cut)[position]
    fc2, scale = mlp_branch(block)
    with torch.no_grad():
        a, c = _fit_lstsq(_activations(uncut, cut, images, dropped[-1], position, scale))
    branch: list[Tensor] = []
    fc2.register_forward_hook(lambda _m, _i, out: branch.append(out if scale is None else out * scale))

    def bridge(_module, _inputs, out):
        h = out[0] if isinstance(out, tuple) else out
        m = branch.pop()
        bridged = (h - m + (m.double() @ a + c).to(h.dtype))
        return (bridged, *out[1:]) if isinstance(out, tuple) else bridged

    block.register_forward_hook(bridge)
    return cut


@pytest.mark.parametrize("family", [*TIMM, *HF])
def test_merged_bridge_equals_the_explicit_bridge(family):
    uncut = make_timm(family) if family in TIMM else make_hf(family)
    torch.manual_seed(2)
    with torch.no_grad():  # layer scales and post-norm gains away from their near-zero inits, so they matter
        for name, param in uncut.named_parameters():
            if name.endswith(("gamma_2", "ls2.gamma", "lambda_2", "layer_scale2.lambda1", "norm2.weight")):
                param.uniform_(0.5, 1.5)
    images, probe = torch.randn(24, 1, 28, 28), torch.randn(6, 1, 28, 28)
    kept = [0, 1]
    if family in REFUSED:
        with pytest.raises(ValueError, match="cannot bridge a cut of .*use bridge='none'"):
            bridge_cut(uncut, cut_vit(uncut, kept), kept, images)
        return
    merged = cut_vit(uncut, kept)
    fit = bridge_cut(uncut, merged, kept, images)
    assert fit.bridged == [{"after": 1, "dropped": [2]}] and fit.images == 24
    with torch.no_grad():
        plain, want, got = (output(m, probe) for m in (cut_vit(uncut, kept), explicit(uncut, kept, images), merged))
    scale = want.abs().max()
    assert (got - want).abs().max() <= 1e-5 * scale
    assert (plain - want).abs().max() > 1e-3 * scale  # the bridge changed the cut
