"""Taps on transformers ViT / DINOv2, DeiT distilled and user-described models."""

import pytest
import timm
import torch
import torch.nn.functional as F
from transformers import Dinov2Config, Dinov2Model, ViTConfig, ViTForImageClassification

import isiwatch
from isiwatch.taps import TapError, custom_parts, vit_parts

HF_SIZE = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, image_size=28, patch_size=7,
               num_channels=1)


def hf_reference(layers, norm_attr, branch, x, p):
    """Layer-by-layer eager reference: attention probabilities from q/k projections written out."""
    rows = []
    for layer in layers:
        attn = layer.attention
        xn = getattr(layer, norm_attr)(x)
        b, t, _ = xn.shape
        q = attn.q_proj(xn).view(b, t, -1, attn.head_dim).transpose(1, 2)
        k = attn.k_proj(xn).view(b, t, -1, attn.head_dim).transpose(1, 2)
        a = torch.softmax(q @ k.transpose(-1, -2) * attn.head_dim ** -0.5, -1)
        y = x + branch(layer, attn(xn)[0])
        z = layer(x)
        d = 1 - F.cosine_similarity(x, y, dim=-1).mean()
        h = -(a * a.log()).sum(-1).mean() / torch.log(torch.tensor(float(t)))
        rows.append({"attn_token_change": float(d), "attn_entropy": float(h),
                     "cls_attention_share": float(t * a[:, :, p:, 0].mean())})
        x = z
    return rows


@pytest.mark.parametrize("kind", ["vit", "dinov2"])
def test_transformers_models_match_reference(kind):
    torch.manual_seed(0)
    images = torch.randn(6, 1, 28, 28)
    if kind == "vit":
        model = ViTForImageClassification(ViTConfig(intermediate_size=64, num_labels=10, **HF_SIZE)).eval()
        layers, norm_attr = model.vit.layers, "layernorm_before"
        x0 = model.vit.embeddings(images)

        def branch(layer, out):
            return out
    else:
        model = Dinov2Model(Dinov2Config(**HF_SIZE)).eval()
        layers, norm_attr = model.encoder.layer, "norm1"
        x0 = model.embeddings(images)

        def branch(layer, out):
            return layer.layer_scale1(out)
    parts = vit_parts(model)
    assert parts.family == "transformers" and parts.depth == 3 and parts.num_prefix_tokens == 1
    result = isiwatch.analyze(model, images, torch.arange(6) % 2)
    with torch.no_grad():
        expected = hf_reference(layers, norm_attr, branch, x0, 1)
    for i, row in enumerate(expected):
        for metric, value in row.items():
            assert result.layers[metric][i] == pytest.approx(value, rel=1e-4, abs=1e-6), (kind, metric, i)
    assert "pre_pe" in result.stem and len(result.layers["probe_cls"]) == 3


def test_deit_distilled_has_two_prefix_tokens():
    torch.manual_seed(0)
    model = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, img_size=28, patch_size=7,
                              in_chans=1, num_classes=10, embed_dim=32, depth=3, num_heads=2)
    parts = vit_parts(model)
    assert parts.num_prefix_tokens == 2 and parts.has_cls
    result = isiwatch.analyze(model, torch.randn(8, 1, 28, 28))
    assert len(result.layers["isi"]) == 3


def test_custom_parts_and_untappable_models():
    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=28, patch_size=7, in_chans=1,
                            num_classes=10, embed_dim=32, depth=3, num_heads=2)
    images = torch.randn(8, 1, 28, 28)
    parts = custom_parts(list(vit.blocks), num_prefix_tokens=1, has_cls=True, norm1=lambda b: b.norm1,
                         attn_branch=lambda b: b.ls1, attention=lambda b: b.attn, patch_embed=vit.patch_embed)
    custom = isiwatch.analyze(vit, images, parts=parts)
    auto = isiwatch.analyze(vit, images)
    assert custom.layers == auto.layers
    with pytest.raises(TapError, match="no list of ViT blocks"):
        vit_parts(timm.create_model("resnet18", pretrained=False))
    wrong = custom_parts(list(vit.blocks), num_prefix_tokens=1, has_cls=True, norm1=lambda b: b.norm1,
                         attn_branch=lambda b: b.ls1, attention=lambda b: b.mlp)
    with pytest.raises(TapError, match="block 0: Mlp computes no attention scores"):
        isiwatch.analyze(vit, images, parts=wrong)
