"""`isiwatch.specialization.convert`: exact conversion, overhead, gradients, tappability and checkpoint round trips."""

import pytest
import timm
import torch

import isiwatch
from isiwatch.io.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from isiwatch.io.models import build_model, load_specialized, save_specialized
from isiwatch.measure.metrics import norm_friction
from isiwatch.specialization.convert import (
    SpecializeOptions,
    parameter_overhead,
    parse_qkv_blocks,
    resolve_qkv_blocks,
    specialization,
    specialize,
)
from isiwatch.specialization.token_split import TokenLayerNorm, TokenLinear
from isiwatch.truncation.healing import make_digits_vit
from isiwatch.watch.friction import friction_alert

KWARGS = dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=32, depth=3, num_heads=2)
MODELS = {  # name: (arch, extra kwargs, number of prefix tokens)
    "cls": ("vit_tiny_patch16_224", {}, 1),
    "registers+layerscale": ("vit_tiny_patch16_224", {"reg_tokens": 4, "init_values": 0.1}, 5),
    "deit-distilled": ("deit_tiny_distilled_patch16_224", {}, 2),
}
OPTIONS = {
    "norms": dict(norms=True),
    "norms+qkv": dict(norms=True, qkv_blocks="first_third"),
    "qkv-lora": dict(norms=False, qkv_blocks=[0, 2], lora_rank=4),
}


def build(name, seed=0):
    arch, extra, _ = MODELS[name]
    torch.manual_seed(seed)
    return timm.create_model(arch, pretrained=False, **KWARGS, **extra).eval()


def perturb_prefix(model, scale=0.5):
    """Move every prefix-token parameter away from its shared twin, as training would."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.rsplit(".", 1)[-1].startswith("prefix_"):
                p.add_(scale * torch.randn_like(p))


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("name", MODELS)
def test_conversion_computes_the_same_function(name, options, fused):
    model = build(name)
    for block in model.blocks:
        block.attn.fused_attn = fused
    x = torch.randn(4, 1, 28, 28)
    with torch.no_grad():
        tokens, logits = model.forward_features(x), model(x)
    opts = dict(OPTIONS[options], layer_scale=name == "registers+layerscale")
    assert specialize(model, **opts) is model
    with torch.no_grad():
        assert (model.forward_features(x) - tokens).abs().max() <= 1e-5
        assert (model(x) - logits).abs().max() <= 1e-5
    assert all(b.attn.fused_attn == fused for b in model.blocks)
    perturb_prefix(model)  # the prefix parameters are live: moving them changes the function
    with torch.no_grad():
        assert (model(x) - logits).abs().max() > 1e-3


def test_prefix_parameters_only_touch_prefix_tokens():
    model = build("deit-distilled")
    norm = TokenLayerNorm.from_norm(model.blocks[0].norm1, num_prefix_tokens=2)
    qkv = TokenLinear.from_linear(model.blocks[0].attn.qkv, num_prefix_tokens=2)
    x = torch.randn(3, 18, 32)
    with torch.no_grad():
        before = norm(x), qkv(x)
        perturb_prefix(norm)
        perturb_prefix(qkv)
        after = norm(x), qkv(x)
    for b, a in zip(before, after):
        assert torch.equal(b[:, 2:], a[:, 2:])
        assert (b[:, :2] - a[:, :2]).abs().min() > 0


def test_overhead_on_the_digits_vit():
    fractions = {}
    for name, opts in {"norms": {}, "qkv": {"qkv_blocks": "first_third"},
                       "lora": {"qkv_blocks": "first_third", "lora_rank": 8}}.items():
        model, _ = make_digits_vit(0)
        base = sum(p.numel() for p in model.parameters())
        specialize(model, **opts)
        over = parameter_overhead(model)
        assert over["base"] == base and over["added"] == sum(p.numel() for p in model.parameters()) - base
        fractions[name] = over["fraction"]
    assert 0 < fractions["norms"] < 0.01
    assert fractions["norms"] < fractions["lora"] < fractions["qkv"] <= 0.10


def test_gradients_reach_prefix_parameters_and_training_moves_them():
    model = build("cls").train()
    specialize(model, qkv_blocks="first_third")
    lora = build("registers+layerscale").train()
    specialize(lora, qkv_blocks=1, lora_rank=2, layer_scale=True)
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    for m in (model, lora):
        torch.nn.functional.cross_entropy(m(x), y).backward()
    prefix = {f"{i}.{n}": p for i, m in enumerate((model, lora)) for n, p in m.named_parameters() if "prefix_" in n}
    # LoRA's A gets no gradient while B is still zero (standard LoRA init); everything else does
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for n, p in prefix.items() if "lora_a" not in n)
    assert {n.split(".", 1)[1] for n in prefix} >= {"blocks.0.norm1.prefix_weight", "blocks.2.norm2.prefix_bias",
                                                    "blocks.0.attn.qkv.prefix_weight", "blocks.0.ls1.prefix_gamma",
                                                    "blocks.0.attn.qkv.prefix_lora_b"}
    block = model.blocks[0]
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert not torch.equal(block.norm1.prefix_weight, block.norm1.weight)
    assert not torch.equal(block.attn.qkv.prefix_weight, block.attn.qkv.weight)


def test_analyze_taps_a_specialised_model():
    model = build("cls")
    x, y = torch.randn(40, 1, 28, 28), torch.arange(40) % 2
    plain = isiwatch.analyze(model, x, y)
    specialize(model, qkv_blocks="first_third")
    same = isiwatch.analyze(model, x, y)
    for metric, curve in plain.layers.items():
        assert torch.allclose(torch.tensor(same.layers[metric]), torch.tensor(curve), atol=1e-5), metric
    perturb_prefix(model, scale=2.0)  # the tap must now see the specialised norm1 of block 0
    inputs = []
    handle = model.blocks[0].register_forward_pre_hook(lambda _m, args: inputs.append(args[0]))
    moved = isiwatch.analyze(model, x, y)
    handle.remove()
    with torch.no_grad():
        expected = norm_friction(inputs[0], model.blocks[0].norm1(inputs[0]), 1).mean()
    assert abs(moved.layers["norm_friction"][0] - expected) < 1e-5
    assert abs(moved.layers["norm_friction"][0] - plain.layers["norm_friction"][0]) > 1e-3


def test_specialization_is_read_back_from_the_layers():
    model = build("registers+layerscale")
    assert specialization(model) is None
    specialize(model, norms=False, qkv_blocks=[2, 0], lora_rank=3, layer_scale=True)
    assert specialization(model) == SpecializeOptions(False, (0, 2), 3, True)
    assert SpecializeOptions.from_dict(specialization(model).to_dict()) == specialization(model)


@pytest.mark.parametrize("bad, message", [
    (dict(qkv_blocks=4), "has 3 blocks"),
    (dict(qkv_blocks=[0, 0]), "distinct"),
    (dict(qkv_blocks="first_half"), "first_third"),
    (dict(lora_rank=4), "lora_rank needs qkv_blocks"),
    (dict(qkv_blocks=1, lora_rank=40), "lora_rank must be"),
    (dict(norms=False), "nothing to specialise"),
    (dict(layer_scale=True), "no LayerScale"),
])
def test_bad_options_are_refused_and_leave_the_model_untouched(bad, message):
    model = build("cls")
    keys = list(model.state_dict())
    with pytest.raises(ValueError, match=message):
        specialize(model, **bad)
    assert list(model.state_dict()) == keys and specialization(model) is None


def test_models_without_prefix_tokens_or_already_specialised_are_refused():
    torch.manual_seed(0)
    pooled = timm.create_model("vit_tiny_patch16_224", pretrained=False, class_token=False, global_pool="avg",
                               **KWARGS)
    with pytest.raises(ValueError, match="no prefix tokens"):
        specialize(pooled)
    model = specialize(build("cls"))
    with pytest.raises(ValueError, match="already specialised"):
        specialize(model)


def test_resolve_and_parse_qkv_blocks():
    assert resolve_qkv_blocks("first_third", 12) == (0, 1, 2, 3)
    assert resolve_qkv_blocks("first_third", 4) == (0,) and resolve_qkv_blocks("first_third", 2) == (0,)
    assert resolve_qkv_blocks(2, 6) == (0, 1) and resolve_qkv_blocks(None, 6) == ()
    assert resolve_qkv_blocks([5, 1], 6) == (1, 5)
    assert [parse_qkv_blocks(t) for t in ("none", "first_third", "3", "0,2")] == [None, "first_third", 3, [0, 2]]
    with pytest.raises(ValueError, match="--qkv-blocks"):
        parse_qkv_blocks("1;2")


@pytest.mark.parametrize("fmt", ["pt", "safetensors"])
def test_specialised_checkpoint_loads_back_strictly(tmp_path, fmt):
    arch, extra, _ = MODELS["registers+layerscale"]
    model = build("registers+layerscale")
    specialize(model, qkv_blocks="first_third", lora_rank=2, layer_scale=True)
    perturb_prefix(model)
    path = save_specialized(tmp_path / f"s.{fmt}", model, arch, {**KWARGS, **extra}, {"note": "x"}, fmt=fmt)
    ckpt = load_checkpoint(path)
    assert ckpt.metadata["specialize"] == specialization(model).to_dict() and ckpt.metadata["note"] == "x"
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        for loaded in (build_model(ckpt), load_specialized(path)):
            assert specialization(loaded) == specialization(model)
            assert torch.equal(loaded.eval()(x), model(x))


def test_loading_refuses_plain_and_tampered_checkpoints(tmp_path):
    plain = save_checkpoint(tmp_path / "plain.pt", "vit_tiny_patch16_224", KWARGS, build("cls").state_dict())
    with pytest.raises(CheckpointError, match="not a specialised checkpoint"):
        load_specialized(plain)
    model = specialize(build("cls"))
    tampered = save_checkpoint(tmp_path / "t.pt", "vit_tiny_patch16_224", KWARGS, model.state_dict(),
                               {"specialize": {"norms": "yes"}})
    with pytest.raises(CheckpointError, match="recorded specialisation"):
        build_model(load_checkpoint(tampered))
    mismatched = save_checkpoint(tmp_path / "m.pt", "vit_tiny_patch16_224", KWARGS, model.state_dict(),
                                 {"specialize": {"norms": True, "qkv_blocks": [0]}})
    with pytest.raises(CheckpointError, match="weights do not fit"):
        build_model(load_checkpoint(mismatched))
    with pytest.raises(ValueError, match="not specialised"):
        save_specialized(tmp_path / "x.pt", build("cls"), "vit_tiny_patch16_224", KWARGS)
    assert not (tmp_path / "x.pt").exists()


def test_friction_alert_fires_on_high_friction_only():
    quiet = [0.01, -0.02, 0.03, float("nan")]
    assert friction_alert(quiet) is None and friction_alert([]) is None
    assert friction_alert({"isi": [0.1]}) is None  # no [CLS]: no norm_friction curve
    alert = friction_alert({"norm_friction": [0.02, 0.35, 0.12, float("nan")]}, threshold=0.1)
    assert alert["kind"] == "norm_friction_high" and alert["severity"] == "info"
    assert alert["data"] == {"max_friction": 0.35, "layer": 1, "threshold": 0.1, "blocks_above": [1, 2]}
    assert "isiwatch specialize" in alert["message"]
    analysis = isiwatch.analyze(build("cls"), torch.randn(8, 1, 28, 28))
    assert friction_alert(analysis) is None and friction_alert(analysis, threshold=-1.0) is not None
