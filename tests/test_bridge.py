"""The linear bridge (`isiwatch.truncation.bridge`): merged into ``fc2`` it computes what the explicit bridge
computes (the kept block's MLP branch ``m`` replaced by ``m·A + c``, by hooks on the unmerged cut), in every
family the project covers; families where it cannot merge are refused in one line."""

import copy

import pytest
import timm
import torch
from test_families import HF, TIMM, make_hf, make_timm
from test_truncate_auto import four_blocks, idle_ckpt  # noqa: F401  (fixtures the last test uses)
from torch import Tensor, nn

import isiwatch
from isiwatch.io.data import embedded_digits
from isiwatch.truncation.bridge import _activations, _fit_lstsq, bridge_cut, dropped_runs, mlp_branch
from isiwatch.truncation.classifier_layout import block_list
from isiwatch.truncation.surgery import cut_vit
from isiwatch.truncation.truncate import truncate
from isiwatch.truncation.uncut_stream import UncutStream, capture

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
        a, c = _fit_lstsq(_activations(UncutStream(uncut, images), cut, kept, position, dropped[-1], scale))
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


def test_a_run_from_block_0_stays_as_cut_and_the_models_rng_and_modes_are_left_alone():
    uncut = make_timm("deit_distilled").train()
    kept = [1, 3]
    uncut.blocks.append(copy.deepcopy(uncut.blocks[2]))  # depth 4: runs [0] (no kept block before) and [2]
    cut = cut_vit(uncut, kept)
    before = {k: v.clone() for k, v in uncut.state_dict().items()}
    images = torch.randn(8, 1, 28, 28)
    rng = torch.get_rng_state()
    fit = bridge_cut(uncut, cut, kept, images)
    assert fit.bridged == [{"after": 1, "dropped": [2]}] and fit.unbridged == [[0]]
    assert torch.equal(torch.get_rng_state(), rng) and uncut.training and cut.training
    assert all(torch.equal(v, before[k]) for k, v in uncut.state_dict().items())
    assert not torch.equal(cut.blocks[0].mlp.fc2.weight, uncut.blocks[1].mlp.fc2.weight)  # bridged into
    assert torch.equal(cut.blocks[1].mlp.fc2.weight, uncut.blocks[3].mlp.fc2.weight)  # after the last run: as is


def test_a_kept_block_with_a_silent_mlp_branch_is_bridged_by_its_bias_alone():
    """An identity block (its fc2 zeroed, as in padded checkpoints) before a dropped run: ``m = 0`` on every token,
    so the normal equations were singular (``torch.linalg.solve`` failed); the bridge is then the mean shift."""
    uncut = make_timm("deit_distilled").eval()
    with torch.no_grad():
        uncut.blocks[1].mlp.fc2.weight.zero_()
        uncut.blocks[1].mlp.fc2.bias.zero_()
    cut, kept, images = cut_vit(uncut, [0, 1]), [0, 1], torch.randn(16, 1, 28, 28)
    fit = bridge_cut(uncut, cut, kept, images)
    assert fit.bridged == [{"after": 1, "dropped": [2]}]
    fc2 = cut.blocks[1].mlp.fc2
    assert torch.equal(fc2.weight, torch.zeros_like(fc2.weight)) and fc2.bias.abs().sum() > 0
    assert torch.isfinite(fc2.bias).all()


def test_cut_bridges_on_images_and_refuses_a_bridge_without_them():
    uncut = make_timm("deit_distilled")
    images = torch.randn(16, 1, 28, 28)
    plain = isiwatch.cut(uncut, 2, strategy="tail")
    bridged = isiwatch.cut(uncut, 2, strategy="tail", images=images, bridge="lstsq")
    assert not torch.equal(plain.blocks[1].mlp.fc2.weight, bridged.blocks[1].mlp.fc2.weight)
    with pytest.raises(ValueError, match="bridge fits the bridge on images: pass images"):
        isiwatch.cut(uncut, 2, strategy="tail", bridge="lstsq")
    with pytest.raises(ValueError, match="unknown bridge fit 'ridge'"):
        isiwatch.cut(uncut, 2, strategy="tail", images=images, bridge="ridge")


@pytest.mark.slow
def test_epochs_0_certifies_a_bridged_cut_deeper_than_the_cut_as_it_is_and_timm_loads_it(idle_ckpt,  # noqa: F811
                                                                                         tmp_path):
    """The trained 4-block ViT with 3 identity blocks (tests/test_truncate_auto.py), no healing, at 3 points: as
    cut the search stops at its 4 trained blocks; the bridge certifies cutting trained blocks too. The written
    file loads strictly into plain timm at that depth and predicts what the returned model predicts."""
    out = tmp_path / "cut.pt"
    result = truncate(idle_ckpt, out, epochs=0, max_drop=3.0, budget=2, images=200)
    search = result.report["search"]
    winner = search["winner"]
    assert winner["repair"] == "bridge" and winner["keep"] < 4 and winner["bridge"]["runs"]
    as_cut = [c["keep"] for c in search["candidates"] if c["repair"] == "none" and c["qualifies"]]
    assert min(as_cut) == 4 and winner["validation_drop"]["upper_bound_points"] <= 3.0
    assert search["bridge"]["calibration_images"] == 200 and search["bridge"]["calibration_seconds"] > 0
    saved = torch.load(out, weights_only=True)
    plain = timm.create_model(saved["arch"], pretrained=False, **saved["model_kwargs"])
    plain.load_state_dict(saved["state_dict"], strict=True)
    assert len(plain.blocks) == winner["keep"]
    images = embedded_digits()[0][-500:]
    with torch.no_grad():
        assert torch.equal(plain.eval()(images).argmax(-1), result.model.eval()(images).argmax(-1))


def test_the_cosine_fit_lowers_the_cosine_distance_the_least_squares_fit_leaves():
    """ReplaceMe's variant: started from least squares, its Adam steps on the cosine distance between the bridged
    stream and the uncut one lower that distance on the calibration tokens."""
    uncut = make_timm("deit_distilled")
    images, kept = torch.randn(32, 1, 28, 28), [0, 1]

    def distance(method):
        cut = cut_vit(uncut, kept)
        bridge_cut(uncut, cut, kept, images, method)
        streams = [[], []]
        with capture(cut.blocks[1], streams[0]), capture(uncut.blocks[2], streams[1]), torch.no_grad():
            cut(images), uncut(images)
        return float((1 - torch.cosine_similarity(*streams[0], *streams[1], dim=-1)).mean())
    assert distance("cosine") < distance("lstsq")


def test_auto_refuses_a_family_the_bridge_cannot_merge_into_before_it_checks_labels_or_cuts():
    """Parallel blocks (no mlp.fc2 ending the residual branch): the search used to fail on its first bridged cut,
    after the labels check and the analysis; now in one line first, and ``bridge='none'`` goes on (here to the
    labels check, which this untrained model fails)."""
    model = make_timm("parallel_scaling")
    with pytest.raises(ValueError, match=r"^cannot bridge a cut of ParallelScalingBlock: .* use bridge='none'$"):
        truncate(model, None, epochs=0, budget=1, images=64)
    with pytest.raises(ValueError) as refused:
        truncate(model, None, epochs=0, budget=1, images=64, bridge="none")
    assert "cannot bridge" not in str(refused.value)
