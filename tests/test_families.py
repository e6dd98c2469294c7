"""Every ViT family against an independent reference: the model run with its unfused (eager) attention,
probabilities read where the model computes them (timm: the input of ``attn_drop``; CaiT's talking heads: the
input of ``proj_w``; transformers: ``output_attentions``), X/Z from the blocks' own forward hooks, Y = the
input of the block's MLP sub-layer, and the metrics written out plainly. isiwatch analyses the same weights
with the fused attention left on."""

import copy
import math

import pytest
import timm
import torch
import torch.nn.functional as F
import transformers as hf
from torch import nn

import isiwatch
from isiwatch.taps import TapError, vit_parts

TINY = dict(pretrained=False, img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=32, depth=3,
            num_heads=2)
#: timm family → (architecture, extra kwargs)
TIMM = {
    "eva02": ("eva02_tiny_patch14_224", {}),
    "eva_rope_registers": ("vit_base_patch16_rope_reg1_gap_256", {}),
    "beit": ("beit_base_patch16_224", {}),
    "beitv2": ("beitv2_base_patch16_224", {}),
    "cait": ("cait_xxs24_224", {"depth_token_only": 2}),
    "parallel_scaling": ("vit_base_patch16_xp_224", {}),
    "parallel_things": ("vit_small_patch16_18x2_224", {}),
    "diff_parallel_fused_proj": ("vit_dpwee_patch16_reg1_gap_256", {}),
    "relpos": ("vit_relpos_base_patch16_224", {}),
    "relpos_res_post": ("vit_relpos_base_patch16_rpn_224", {}),
    "deit_distilled": ("deit_tiny_distilled_patch16_224", {}),
    "naflexvit": ("naflexvit_base_patch16_gap", {}),
    "vit_siglip_style": ("vit_base_patch16_siglip_224", {}),
}
HF_SIZE = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, image_size=28, patch_size=7,
               num_channels=1, intermediate_size=64)
#: transformers family → model factory
HF = {
    "hf_vit": lambda: hf.ViTModel(hf.ViTConfig(**HF_SIZE)),
    "hf_deit_distilled": lambda: hf.DeiTForImageClassificationWithTeacher(hf.DeiTConfig(**HF_SIZE)),
    "hf_beit": lambda: hf.BeitModel(hf.BeitConfig(**HF_SIZE, use_relative_position_bias=True,
                                                  layer_scale_init_value=0.5)),
    "hf_dinov2": lambda: hf.Dinov2Model(hf.Dinov2Config(**HF_SIZE)),
    "hf_dinov2_registers": lambda: hf.Dinov2WithRegistersModel(hf.Dinov2WithRegistersConfig(**HF_SIZE)),
    "hf_clip_vision": lambda: hf.CLIPVisionModel(hf.CLIPVisionConfig(**HF_SIZE)),
    "hf_siglip_vision": lambda: hf.SiglipVisionModel(hf.SiglipVisionConfig(**HF_SIZE)),
}


def sharpen(model: nn.Module) -> nn.Module:
    """Larger q/k weights and relative position biases than the default init, so entropies and biases matter."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if any(k in name for k in ("qkv.weight", "q_proj.weight", "k_proj.weight", "in_proj.weight",
                                       "attn.q.weight", "attn.k.weight", "query.weight", "key.weight")):
                param.mul_(6.0)
            if "relative_position_bias_table" in name:
                param.normal_(0, 2.0)
            if name.endswith(("gamma_1", "lambda_1", "ls1.gamma", "layer_scale1.lambda1")):
                param.uniform_(0.5, 1.5)
    return model.eval()


def make_timm(family: str) -> nn.Module:
    torch.manual_seed(0)
    arch, extra = TIMM[family]
    return sharpen(timm.create_model(arch, **{**TINY, **extra}))


def make_hf(family: str) -> nn.Module:
    torch.manual_seed(0)
    return sharpen(HF[family]())


def reference_metrics(x, xn, y, z, a, p, has_cls) -> dict[str, float]:
    """The block metrics written out: a (B,H,Tq,Tk) attention probabilities, the rest (B,T,D)."""
    def cos(u, v):
        return F.cosine_similarity(u, v, dim=-1)

    tk = a.shape[-1]
    patches = z[:, p:]
    u = F.normalize(patches - patches.mean((0, 1)), dim=-1)
    sim = u @ u.transpose(1, 2)
    n = sim.shape[-1]
    out = {"attn_token_change": (1 - cos(x, y)).mean(), "block_influence": (1 - cos(x, z)).mean(),
           "attn_entropy": (-torch.xlogy(a, a).sum(-1)).mean() / math.log(tk),
           "token_similarity": ((sim.sum((1, 2)) - sim.diagonal(dim1=1, dim2=2).sum(-1)) / (n * (n - 1))).mean()}
    if has_cls:
        out["cls_attention_share"] = tk * a[:, :, p:, 0].mean() if a.shape[-2] == tk else math.nan
        out["cls_patch_cos"] = cos(z[:, :1], z[:, p:]).mean()
        out["norm_friction"] = cos(x[:, :1], x[:, p:]).mean() - cos(xn[:, :1], xn[:, p:]).mean()
    return {k: float(v) for k, v in out.items()}


def _parallel_scaling_y(blk, x, a):
    """Y of a parallel-scaling block: X + ls(attention half of the output projection), spelled out."""
    b, n, c = x.shape
    x_mlp, q, k, v = torch.split(blk.in_proj(blk.in_norm(x)), blk.in_split, dim=-1)
    heads = blk.num_heads
    if hasattr(blk, "lambda_init"):  # differential attention: two maps per head, one difference
        v = v.view(b, n, heads, -1).transpose(1, 2)
        pair = a.view(b, heads, 2, n, n)
        x_attn = (pair[:, :, 0] - blk._compute_lambda() * pair[:, :, 1]) @ v
        x_attn = blk.sub_norm(x_attn) * (1 - blk.lambda_init)
    else:
        x_attn = a @ v.view(b, n, heads, -1).transpose(1, 2)
    x_attn = x_attn.transpose(1, 2).reshape(b, n, c)
    share = blk.attn_out_proj(x_attn) if blk.out_proj is None else x_attn @ blk.out_proj.weight[:, :c].T
    return x + blk.ls(share)


def timm_reference(model, images):
    """Per block (metrics, p, has_cls) with every attention unfused."""
    model = copy.deepcopy(model)
    for m in model.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = False
    is_cait = hasattr(model, "blocks_token_only")
    blocks = list(model.blocks) + list(getattr(model, "blocks_token_only", []))
    rec = [dict() for _ in blocks]

    def hook(i, key, fn):
        return lambda m, inp, out: rec[i].__setitem__(key, fn(inp, out).detach().clone())

    for i, blk in enumerate(blocks):
        class_attention = is_cait and i >= len(model.blocks)
        if class_attention:
            blk.register_forward_hook(hook(i, "x", lambda inp, out: torch.cat([inp[1], inp[0]], 1)))
            blk.register_forward_hook(hook(i, "z", lambda inp, out: torch.cat([out, inp[0]], 1)))
            blk.norm2.register_forward_hook(hook(i, "y_cls", lambda inp, out: inp[0]))
        else:
            blk.register_forward_hook(hook(i, "x", lambda inp, out: inp[0]))
            blk.register_forward_hook(hook(i, "z", lambda inp, out: out))
        attn = getattr(blk, "attn", None) or blk
        if hasattr(attn, "proj_w"):  # talking heads: softmax output enters the post-softmax head mixing
            attn.proj_w.register_forward_hook(hook(i, "a", lambda inp, out: inp[0].permute(0, 3, 1, 2)))
        elif hasattr(blk, "attns"):
            for j, branch in enumerate(blk.attns):
                branch.attn.attn_drop.register_forward_hook(hook(i, f"a{j}", lambda inp, out: inp[0]))
        else:
            attn.attn_drop.register_forward_hook(hook(i, "a", lambda inp, out: inp[0]))
        if hasattr(blk, "in_norm"):
            blk.in_norm.register_forward_hook(hook(i, "xn", lambda inp, out: out))
        elif hasattr(blk, "attns"):
            blk.attns[0].norm.register_forward_hook(hook(i, "xn", lambda inp, out: out))
        elif "Post" not in type(blk).__name__:
            blk.norm1.register_forward_hook(hook(i, "xn", lambda inp, out: out))
        if hasattr(blk, "ffns"):
            blk.ffns[0].register_forward_hook(hook(i, "y", lambda inp, out: inp[0]))
        elif "Post" in type(blk).__name__:
            blk.mlp.register_forward_hook(hook(i, "y", lambda inp, out: inp[0]))
        elif not class_attention and hasattr(blk, "norm2"):
            blk.norm2.register_forward_hook(hook(i, "y", lambda inp, out: inp[0]))
    with torch.no_grad():
        model(images)
        rows = []
        for i, (blk, r) in enumerate(zip(blocks, rec)):
            a = r["a"] if "a" in r else torch.cat([r[k] for k in sorted(r) if k.startswith("a")], dim=1)
            if "y_cls" in r:
                r["y"] = torch.cat([r["y_cls"], r["x"][:, 1:]], 1)
            if "y" not in r:
                r["y"] = _parallel_scaling_y(blk, r["x"], a)
            if is_cait:
                p, has_cls = (0, False) if i < len(model.blocks) else (1, True)
            else:
                p = model.num_prefix_tokens
                cls = model.embeds.cls_token if hasattr(model, "embeds") else model.cls_token
                has_cls = cls is not None
            rows.append(reference_metrics(r["x"], r.get("xn", r["x"]), r["y"], r["z"], a, p, has_cls))
    return rows


HF_NAMES = {"norm": ("layernorm_before", "norm1", "layer_norm1"), "y": ("layernorm_after", "norm2", "layer_norm2")}


def hf_reference(model, images):
    model = copy.deepcopy(model)
    model.set_attn_implementation("eager")
    layers = vit_parts(model).blocks
    rec = [dict() for _ in layers]
    for i, bp in enumerate(layers):
        layer = bp.block
        layer.register_forward_pre_hook(
            lambda m, args, kwargs, i=i: rec[i].__setitem__("x", (args[0] if args else kwargs["hidden_states"])),
            with_kwargs=True)
        layer.register_forward_hook(lambda m, inp, out, i=i: rec[i].__setitem__("z", out[0] if isinstance(
            out, tuple) else out))
        norm = next(getattr(layer, n) for n in HF_NAMES["norm"] if hasattr(layer, n))
        norm.register_forward_hook(lambda m, inp, out, i=i: rec[i].__setitem__("xn", out))
        after = next(getattr(layer, n) for n in HF_NAMES["y"] if hasattr(layer, n))
        after.register_forward_hook(lambda m, inp, out, i=i: rec[i].__setitem__("y", inp[0]))
    with torch.no_grad():
        out = model(images, output_attentions=True)
    emb = getattr(model, "embeddings", None) or model.deit.embeddings
    has_cls = getattr(emb, "cls_token", None) is not None or getattr(emb, "class_embedding", None) is not None
    registers = getattr(emb, "register_tokens", None)
    p = int(has_cls) + int(getattr(emb, "distillation_token", None) is not None) + (
        0 if registers is None else registers.shape[1])
    return [reference_metrics(r["x"], r["xn"], r["y"], r["z"], a, p, has_cls)
            for r, a in zip(rec, out.attentions)], p, has_cls


def assert_matches(result, expected, family):
    assert len(result.layers["attn_entropy"]) == len(expected)
    for i, row in enumerate(expected):
        for metric, value in row.items():
            got = result.layers[metric][i]
            if math.isnan(value):
                assert math.isnan(got), (family, metric, i)
            else:
                assert got == pytest.approx(value, rel=1e-4, abs=1e-6), (family, metric, i, got, value)
        assert result.layers["isi"][i] == pytest.approx(row["attn_token_change"] * row["attn_entropy"], rel=1e-4,
                                                        abs=1e-7)


IMAGES = torch.randn(6, 1, 28, 28, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("family", sorted(TIMM))
def test_timm_family_matches_reference(family):
    model = make_timm(family)
    result = isiwatch.analyze(model, IMAGES, torch.arange(6) % 2)
    expected = timm_reference(model, IMAGES)
    assert_matches(result, expected, family)
    assert all(getattr(m, "fused_attn", True) for m in model.modules())  # the fused path stayed on


@pytest.mark.parametrize("family", sorted(HF))
def test_transformers_family_matches_reference(family):
    model = make_hf(family)
    assert model.config._attn_implementation == "sdpa"
    result = isiwatch.analyze(model, IMAGES, torch.arange(6) % 2)
    expected, p, has_cls = hf_reference(model, IMAGES)
    assert result.model_info["num_prefix_tokens"] == p and result.model_info["has_cls"] == has_cls
    assert_matches(result, expected, family)
    assert ("probe_cls" in result.layers) == has_cls


def test_the_biases_and_rotary_embeddings_are_in_the_scores():
    """Ignoring BEiT's relative position bias or EVA's rotary embedding would change the entropy: the reference
    test above would fail on a tap that rebuilt scores from q/k projections alone."""
    for family in ("beit", "eva02", "relpos"):
        model = make_timm(family)
        with_bias = isiwatch.analyze(model, IMAGES).layers["attn_entropy"]
        for name, param in model.named_parameters():
            if "relative_position_bias_table" in name or ".rel_pos." in name:
                param.data.zero_()
        if family == "eva02":
            model.rope = None
        without = isiwatch.analyze(model, IMAGES).layers["attn_entropy"]
        assert max(abs(a - b) for a, b in zip(with_bias, without)) > 1e-3, family


def test_cait_class_attention_blocks_are_tapped_after_the_self_attention_blocks():
    model = make_timm("cait")
    parts = vit_parts(model)
    assert parts.depth == len(model.blocks) + len(model.blocks_token_only) == 5
    result = isiwatch.analyze(model, IMAGES, torch.arange(6) % 2)
    assert all(math.isnan(v) for v in result.layers["cls_patch_cos"][:3])
    assert all(math.isnan(v) for v in result.layers["probe_cls"][:3])
    assert all(not math.isnan(v) for v in result.layers["probe_cls"][3:])
    assert all(math.isnan(v) for v in result.layers["cls_attention_share"])  # patches never query [CLS]


def test_hierarchical_models_are_declined_in_one_line():
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, num_classes=10, depths=(1, 1, 1, 1))
    with pytest.raises(TapError, match="hierarchical vision transformers .* are not supported") as err:
        vit_parts(model)
    assert "\n" not in str(err.value)
