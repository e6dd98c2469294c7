"""Every metric against a plainly written independent computation (hooks on the unfused attention path)."""

import copy
import math

import pytest
import timm
import torch
import torch.nn.functional as F

import isiwatch
from isiwatch.measure.probes import split_images

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
    u = F.normalize(e - e.mean((0, 1)), dim=-1)  # centred mean pairwise cosine (i ≠ j), written out
    n = u.shape[1]
    expected = torch.stack([((g := ui @ ui.T).sum() - g.diagonal().sum()) / (n * (n - 1)) for ui in u]).mean()
    assert result.stem["pre_pe"]["token_similarity"] == pytest.approx(float(expected), rel=1e-5)
    assert len(result.layers["isi_recon"]) == 4
    assert all(-2 < v < 1 for v in result.layers["isi_recon"])
    row = result.to_dict()["layers"][0]
    assert row["index"] == 0 and {"probe_cls", "probe_patch_mean", "isi", "isi_recon"} <= set(row)


def reference_ridge_predict(x_train, y_train, x_test):
    """Ridge with an unpenalised intercept on features standardised on the training rows, its regulariser
    λ = α·‖X‖²_F / min(n, D) (α in 1e-4 … 1e2: relative to the mean squared singular value) chosen by
    brute-force leave-one-out mean squared error (refit without each row; ties to the larger α).
    x_*: (K, n, D), y_train: (K, n, C), float64. Returns the test predictions (K, m, C)."""
    k, n, d = x_train.shape
    mean, scale = x_train.mean(1, keepdim=True), x_train.std(1, keepdim=True).clamp_min(1e-6)
    xs, xt = (x_train - mean) / scale, (x_test - mean) / scale
    eye = torch.eye(d, dtype=torch.float64)

    def fit(x, y, lam):  # (..., r, D), (..., r, C), (..., 1, 1) -> weights, intercept
        x_bar, y_bar = x.mean(-2, keepdim=True), y.mean(-2, keepdim=True)
        xc = x - x_bar
        w = torch.linalg.solve(xc.transpose(-1, -2) @ xc + lam * eye, xc.transpose(-1, -2) @ (y - y_bar))
        return w, y_bar - x_bar @ w

    best, best_lam = None, None
    for alpha in [10.0 ** e for e in range(-4, 3)]:
        lam = alpha * xs.pow(2).sum((1, 2)) / min(n, d)  # (K,)
        errors = []
        for i in range(n):
            rest = [j for j in range(n) if j != i]
            w, b = fit(xs[:, rest], y_train[:, rest], lam.view(k, 1, 1))
            errors.append((xs[:, i:i + 1] @ w + b - y_train[:, i:i + 1]).pow(2).mean((1, 2)))
        score = -torch.stack(errors).mean(0)  # (K,)
        take = score >= best if best is not None else torch.ones(k, dtype=torch.bool)
        best = torch.where(take, score, best) if best is not None else score
        best_lam = torch.where(take, lam, best_lam) if best_lam is not None else lam
    w, b = fit(xs, y_train, best_lam.view(k, 1, 1))
    return xt @ w + b


def reference_isi_recon(tokens, targets, train, test, components=8):
    """The paper's reconstruction ISI as isiwatch's recipe states it: held-out R² of recovering the patch
    embeddings E (B,N,De) from the layer's patch tokens H (B,N,D), all positions together (each token
    reduced to its top principal components of the pooled training tokens) minus position by position."""
    h, e = tokens.double(), targets.double()
    e_bar = e[train].mean(0, keepdim=True)

    def r2(pred):
        return float(1 - (e[test] - pred).pow(2).sum() / (e[test] - e_bar).pow(2).sum())

    per_position = reference_ridge_predict(h[train].transpose(0, 1), e[train].transpose(0, 1),
                                           h[test].transpose(0, 1)).transpose(0, 1)
    pooled = h[train].flatten(0, 1)
    centre = pooled.mean(0)
    basis = torch.linalg.svd(pooled - centre, full_matrices=False).Vh[:components].T  # (D, k)
    flat = ((h - centre) @ basis).flatten(1)  # (B, N·k)
    together = reference_ridge_predict(flat[train][None], e[train].flatten(1)[None], flat[test][None])[0]
    return r2(together.view_as(e[test])) - r2(per_position)


@pytest.mark.parametrize("variant", ["cls", "registers"])
def test_isi_recon_matches_the_papers_recipe(variant):
    model = make_vit(variant, True).eval()
    images = torch.randn(48, 1, 28, 28)
    result = isiwatch.analyze(model, images, with_isi_recon=True)
    train, test = split_images(images)  # the seeded 70/30 split of the images ranked by content, as the probes'
    assert (len(train), len(test)) == (34, 14)
    p = model.num_prefix_tokens
    with torch.no_grad():
        e = model.patch_embed(images)  # patch embeddings before positional encoding, (B, N, De)
        x = model.norm_pre(model._pos_embed(e))
        expected = []
        for blk in model.blocks:
            x = blk(x)
            expected.append(reference_isi_recon(x[:, p:], e, train, test))
    assert result.layers["isi_recon"] == pytest.approx(expected, abs=1e-4)
    assert max(abs(v) for v in expected) > 0.05  # not a curve of zeros


def test_token_similarity_keeps_its_precision_when_tokens_collapse():
    """Tokens within 1e-4 of a large common centre (rank collapse, what the metric exists to see): the centred
    directions must be formed from z − centre, not from ‖z‖² − 2 z·centre + ‖centre‖², which cancels in fp32."""
    from isiwatch.measure.metrics import token_similarity

    torch.manual_seed(0)
    z = torch.randn(64) * 10 + 1e-4 * torch.randn(4, 17, 64)
    assert (token_similarity(z, 1) - token_similarity(z.double(), 1)).abs().max() < 1e-3
