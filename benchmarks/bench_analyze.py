"""Offline analysis cost, side by side in one run.

(a) one plain forward pass over the probe images (the floor), (b) ``isiwatch.analyze`` without labels
(the probe pass and every metric) and with labels (both probes too; the probe stage is the difference),
(c) a naive implementation that keeps every activation, computes the metrics from the stored tensors
(unfused attention) and fits one scikit-learn LogisticRegression per layer and feature kind. Reports
medians of repeated runs and the ratios, and the probe accuracies of (b) vs (c).

    python benchmarks/bench_analyze.py [--checkpoint isiwatch-demo/model.pt] [--repeats 5]

The figures, the curves of the analysed model and the machine with its load go to
``benchmarks/results/analyze/analyze.json`` (``--out``), which ``benchmarks/report.py`` renders.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import timm
import torch
import torch.nn.functional as F
from sklearn.linear_model import LogisticRegression

sys.path.insert(0, str(Path(__file__).parent))
from machine import machine  # noqa: E402

import isiwatch  # noqa: E402
from isiwatch._utils.files import write_json  # noqa: E402
from isiwatch._utils.threads import add_threads_argument, current_load, set_torch_threads  # noqa: E402
from isiwatch.io.checkpoint import load_checkpoint  # noqa: E402
from isiwatch.io.data import DIGITS_TRAIN, embedded_digits  # noqa: E402
from isiwatch.io.models import build_model  # noqa: E402
from isiwatch.measure.probes import probe_accuracy, split_indices  # noqa: E402
from isiwatch.truncation.healing import make_digits_vit, train_classifier  # noqa: E402

RESULT = Path(__file__).parent / "results" / "analyze" / "analyze.json"


def timed(fn, repeats: int) -> tuple[float, object]:
    fn()  # warm-up
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def interleaved(fns: dict, repeats: int) -> tuple[dict[str, float], dict]:
    """Median wall time of each function, run in alternation so machine noise hits all alike."""
    outs = {name: fn() for name, fn in fns.items()}  # warm-up
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            outs[name] = fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}, outs


def naive_activations(model, images):
    """Every block's X, Y, Z and attention probabilities, kept in memory (unfused attention)."""
    model = copy.deepcopy(model).eval()
    store = {"A": []}
    for blk in model.blocks:
        blk.attn.fused_attn = False
        blk.attn.attn_drop.register_forward_hook(lambda m, i, o: store["A"].append(i[0]))
    with torch.no_grad():
        x = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(images))))
        xs, ys, zs = [], [], []
        for blk in model.blocks:
            y = x + blk.ls1(blk.attn(blk.norm1(x)))
            z = y + blk.ls2(blk.mlp(blk.norm2(y)))  # same as blk(x) in eval mode
            xs.append(x), ys.append(y), zs.append(z)
            x = z
    return xs, ys, zs, store["A"]


def naive_analysis(model, images, labels, p):
    xs, ys, zs, attns = naive_activations(model, images)
    metrics = []
    for x, y, z, a in zip(xs, ys, zs, attns):
        d = 1 - F.cosine_similarity(x, y, dim=-1).mean()
        h = -(a * a.clamp_min(1e-30).log()).sum(-1).mean() / torch.log(torch.tensor(float(a.shape[-1])))
        patches = z[:, p:]
        u = F.normalize(patches - patches.mean((0, 1)), dim=-1)
        gram = u @ u.transpose(1, 2)
        n = u.shape[1]
        sim = ((gram.sum((1, 2)) - gram.diagonal(dim1=1, dim2=2).sum(-1)) / (n * (n - 1))).mean()
        metrics.append((float(d), float(h), float(d * h), float(sim)))
    start = time.perf_counter()
    accs = naive_probes(zs, labels, p)
    return metrics, accs, time.perf_counter() - start


def naive_probes(zs, labels, p):
    train, test = split_indices(len(labels), 0.7, seed=0)
    accs = {"cls": [], "patch_mean": []}
    for z in zs:
        for kind, feats in (("cls", z[:, 0]), ("patch_mean", z[:, p:].mean(1))):
            f = feats.numpy()
            mu, sd = f[train].mean(0), f[train].std(0) + 1e-6
            clf = LogisticRegression(max_iter=2000).fit((f[train] - mu) / sd, labels[train].numpy())
            accs[kind].append(float(clf.score((f[test] - mu) / sd, labels[test].numpy())))
    return accs


def our_probes(zs, labels, p):
    train, test = split_indices(len(labels), 0.7, seed=0)
    feats = torch.cat([torch.stack([z[:, p:].mean(1) for z in zs]), torch.stack([z[:, 0] for z in zs])])
    start = time.perf_counter()
    acc = probe_accuracy(feats, labels, train, test).tolist()
    return {"patch_mean": acc[:len(zs)], "cls": acc[len(zs):]}, time.perf_counter() - start


def bench(name, model, images, labels, repeats, with_naive=True) -> tuple[object, dict]:
    """Time plain forward vs ``analyze`` without labels (tap + every metric) and with labels (+ both probes), run
    interleaved; the probe stage is the difference. Optionally the naive implementation. Returns the analysis and
    a record of the figures."""
    p = model.num_prefix_tokens
    n = len(images)
    times, outs = interleaved({"plain": lambda: _plain(model, images),
                               "metrics": lambda: isiwatch.analyze(model, images, batch_size=n),
                               "ours": lambda: isiwatch.analyze(model, images, labels, batch_size=n)}, repeats)
    t_plain, t_metrics, t_ours, analysis = times["plain"], times["metrics"], times["ours"], outs["ours"]
    record = {"name": name, "images": n, "blocks": len(model.blocks), "repeats": repeats,
              "plain_ms": t_plain * 1e3, "metrics_ms": t_metrics * 1e3, "analyze_ms": t_ours * 1e3}
    lines = [f"### {name}: {n} images, {len(model.blocks)} blocks",
             f"plain forward        {t_plain * 1e3:8.1f} ms   1.00x",
             f"analyze, no labels   {t_metrics * 1e3:8.1f} ms   {t_metrics / t_plain:.2f}x  (pass + every metric)",
             f"isiwatch.analyze     {t_ours * 1e3:8.1f} ms   {t_ours / t_plain:.2f}x  (all metrics + both probes)",
             f"probe stage          {(t_ours - t_metrics) * 1e3:8.1f} ms   (the difference)"]
    if with_naive:
        t_naive, (metrics, naive_accs, t_sklearn) = timed(lambda: naive_analysis(model, images, labels, p), 1)
        zs = naive_activations(model, images)[2]
        ours, _ = our_probes(zs, labels, p)
        t_probe = statistics.median(our_probes(zs, labels, p)[1] for _ in range(repeats))
        worst = max(abs(m[3] - analysis.layers["token_similarity"][i]) for i, m in enumerate(metrics))
        record.update({"naive_ms": t_naive * 1e3, "probe_ours_ms": t_probe * 1e3, "probe_sklearn_ms": t_sklearn * 1e3,
                       "probe_ours": ours, "probe_sklearn": naive_accs, "max_token_similarity_diff": worst})
        lines += [f"naive (keep all + sklearn) {t_naive * 1e3:8.1f} ms   {t_naive / t_plain:.2f}x",
                  f"probes alone: isiwatch {t_probe * 1e3:.1f} ms vs sklearn LogisticRegression {t_sklearn * 1e3:.1f} "
                  f"ms -> {t_sklearn / t_probe:.0f}x faster"]
        for kind in ("cls", "patch_mean"):
            diffs = [(a - b) * 100 for a, b in zip(ours[kind], naive_accs[kind])]
            lines += [f"probe_{kind}: isiwatch {[round(a, 3) for a in ours[kind]]}",
                      f"probe_{kind}: sklearn {[round(a, 3) for a in naive_accs[kind]]}",
                      f"probe_{kind}: mean |diff| {statistics.mean(map(abs, diffs)):.2f} points, "
                      f"max {max(map(abs, diffs)):.2f} points"]
        lines.append(f"metric agreement with naive: max |token_similarity diff| {worst:.2e}")
    print("\n" + "\n".join(lines), flush=True)
    return analysis, record


@torch.no_grad()
def _plain(model, images):
    was = model.training
    model.eval()
    out = model(images)
    model.train(was)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="demo checkpoint (default: train the demo model, 10 epochs)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULT, help="where the figures go as JSON")
    add_threads_argument(parser)
    args = parser.parse_args()
    threads = set_torch_threads(args.threads)
    record = machine(threads)
    print(f"torch {torch.__version__}, timm {timm.__version__}, {threads} threads")

    images, labels = embedded_digits()
    if args.checkpoint:
        model = build_model(load_checkpoint(args.checkpoint))
    else:
        model, _ = make_digits_vit(0)
        train_classifier(model, images[:DIGITS_TRAIN], labels[:DIGITS_TRAIN], epochs=10)
    test_x, test_y = images[DIGITS_TRAIN:], labels[DIGITS_TRAIN:]
    analysis, demo = bench("demo ViT (depth 12, width 64) on the held-out digits", model, test_x, test_y,
                           args.repeats)
    print("\ncurves of the demo-trained model:")
    for metric, values in analysis.layers.items():
        print(f"  {metric:20s} {' '.join(f'{v:.3f}' for v in values)}")
    print(f"  phases: {analysis.phases}")

    torch.manual_seed(0)
    vit_s = timm.create_model("vit_small_patch16_224", pretrained=False).eval()
    _, small = bench("ViT-S/16 at 224 px (random init, timing only)", vit_s, torch.randn(32, 3, 224, 224),
                     torch.arange(32) % 4, max(2, args.repeats // 2), with_naive=False)
    torch.manual_seed(0)
    eva = timm.create_model("eva02_small_patch14_224", pretrained=False).eval()  # rotary q/k inside attention
    _, eva_small = bench("EVA-02-S/14 at 224 px (random init, timing only)", eva, torch.randn(32, 3, 224, 224),
                         torch.arange(32) % 4, max(2, args.repeats // 2), with_naive=False)
    record["load_1min_end"] = round(current_load(), 2)
    write_json(args.out, {"machine": record, "args": {k: str(v) for k, v in vars(args).items()},
                          "benches": [demo, small, eva_small], "analysis": analysis.to_dict()})


if __name__ == "__main__":
    main()
