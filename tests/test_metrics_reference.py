"""Every metric against a plainly written independent computation (hooks on the unfused attention path)."""

import copy
import math

import pytest
import timm
import torch
import torch.nn.functional as F

import isiwatch

VARIANTS = {
    "cls": dict(),
    "registers": dict(reg_tokens=2),
    "no_cls": dict(class_token=False, global_pool="avg"),
}


def make_vit(variant: str, fused: bool, depth: int = 4) -> torch.nn.Module:
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=28, patch_size=7, in_chans=1,
                              num_classes=10, embed_dim=32, depth=depth, num_heads=4, **VARIANTS[variant])
    with torch.no_grad():  # sharper attention than the default init, so entropies are not all ≈ 1
        for blk in model.blocks:
            blk.attn.qkv.weight.mul_(12.0)
    for blk in model.blocks:
        blk.attn.fused_attn = fused
    return model


def reference_curves(model, images, p, has_cls):
    """Block-by-block forward with unfused attention; probabilities read from attn_drop's input."""
    model = copy.deepcopy(model).eval()
    probs = []
    for blk in model.blocks:
        blk.attn.fused_attn = False
        blk.attn.attn_drop.register_forward_hook(lambda m, i, o: probs.append(i[0].clone()))
    rows = []
    with torch.no_grad():
        x = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(images))))
        for blk in model.blocks:
            xn = blk.norm1(x)
            y = x + blk.ls1(blk.attn(xn))
            a = probs[-1]
            z = blk(x)
            assert torch.allclose(probs[-1], a)  # the block call re-ran the same attention
            t = x.shape[1]
            d = 1 - F.cosine_similarity(x, y, dim=-1).mean()
            h = -(a * torch.log(a.clamp_min(1e-30))).sum(-1).mean() / math.log(t)
            patches = z[:, p:]
            u = F.normalize(patches - patches.mean((0, 1)), dim=-1)
            n = u.shape[1]
            sims = [((g := ui @ ui.T).sum() - g.diagonal().sum()) / (n * (n - 1)) for ui in u]
            row = {"attn_token_change": d, "attn_entropy": h, "isi": d * h,
                   "token_similarity": torch.stack(sims).mean(),
                   "block_influence": 1 - F.cosine_similarity(x, z, dim=-1).mean()}
            if has_cls:
                def cls_cos(tokens):
                    return torch.stack([F.cosine_similarity(tokens[b, 0:1], tokens[b, p:]).mean()
                                        for b in range(len(tokens))]).mean()
                row["cls_attention_share"] = t * a[:, :, p:, 0].mean()
                row["cls_patch_cos"] = cls_cos(z)
                row["norm_friction"] = cls_cos(x) - cls_cos(xn)
            rows.append({k: float(v) for k, v in row.items()})
            x = z
    return rows


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("fused", [True, False])
def test_metrics_match_reference(variant, fused):
    model = make_vit(variant, fused)
    images = torch.randn(24, 1, 28, 28)
    p = model.num_prefix_tokens
    has_cls = model.cls_token is not None
    result = isiwatch.analyze(model, images)
    expected = reference_curves(model, images, p, has_cls)
    for index, row in enumerate(expected):
        for metric, value in row.items():
            got = result.layers[metric][index]
            assert got == pytest.approx(value, rel=1e-4, abs=1e-6), (metric, index)
    missing = {"cls_attention_share", "cls_patch_cos", "norm_friction"} - set(result.layers)
    assert missing == (set() if has_cls else {"cls_attention_share", "cls_patch_cos", "norm_friction"})
    assert 0 < min(result.layers["attn_entropy"]) < 0.99  # attention is not uniform in this model


@pytest.mark.parametrize("fused", [True, False])
def test_analyze_leaves_model_untouched(fused):
    model = make_vit("cls", fused)
    model.train()
    model.blocks[1].eval()
    modes = [m.training for m in model.modules()]
    params = {k: v.clone() for k, v in model.state_dict().items()}
    grads = [p.requires_grad for p in model.parameters()]
    images = torch.randn(8, 1, 28, 28)
    torch.manual_seed(123)
    rng = torch.get_rng_state()
    isiwatch.analyze(model, images, torch.arange(8) % 2)
    assert torch.equal(torch.get_rng_state(), rng)
    assert [m.training for m in model.modules()] == modes
    assert all(blk.attn.fused_attn == fused for blk in model.blocks)
    assert [p.requires_grad for p in model.parameters()] == grads
    assert all(torch.equal(params[k], v) for k, v in model.state_dict().items())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_stem_points_and_isi_recon():
    model = make_vit("cls", True)
    images, labels = torch.randn(64, 1, 28, 28), torch.arange(64) % 4
    result = isiwatch.analyze(model, images, labels, with_isi_recon=True)
    assert set(result.stem) == {"pre_pe", "embed"}
    with torch.no_grad():
        e = model.patch_embed(images)
    assert result.stem["pre_pe"]["token_similarity"] == pytest.approx(
        float(isiwatch.metrics.token_similarity(e, 0).mean()), rel=1e-5)
    assert len(result.layers["isi_recon"]) == 4
    assert all(-2 < v < 1 for v in result.layers["isi_recon"])
    row = result.to_dict()["layers"][0]
    assert row["index"] == 0 and {"probe_cls", "probe_patch_mean", "isi", "isi_recon"} <= set(row)
