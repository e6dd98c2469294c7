"""Probe accuracy against scikit-learn's LogisticRegression, and the probe stage's cost, in one run.

For each model: every block's [CLS] and mean-patch features on held-out images, the probes of
``isiwatch.measure.probes.probe_accuracy`` (ridge + softmax refinement) and ridge alone (``softmax_steps=0``), one
``LogisticRegression(max_iter=2000)`` per layer and kind on the same standardised split; the per-layer gaps
(points, ours − sklearn) and the median probe-stage time of both variants, interleaved. Models: the demo ViT
(depth 12, width 64) trained on the embedded digits, and a random-init ViT-S/16 at 224 px on the digits
resized to 3 channels. Writes ``benchmarks/results/probes/probes.json``.

    python benchmarks/bench_probes.py [--checkpoint isiwatch-demo/model.pt] [--repeats 5]
    python benchmarks/bench_probes.py --tiny --out /tmp/probes.json      # seconds: checks the script works
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import timm
import torch
import torch.nn.functional as F
from machine import machine
from sklearn.linear_model import LogisticRegression

from isiwatch._utils.files import write_json
from isiwatch._utils.threads import add_threads_argument, current_load, set_torch_threads
from isiwatch.io.checkpoint import load_checkpoint
from isiwatch.io.data import DIGITS_TRAIN, embedded_digits
from isiwatch.io.models import build_model
from isiwatch.measure.probes import probe_accuracy, split_indices
from isiwatch.measure.softmax import SOFTMAX_STEPS
from isiwatch.truncation.healing import make_digits_vit, train_classifier

RESULTS = Path(__file__).parent / "results" / "probes" / "probes.json"


@torch.no_grad()
def block_features(model: torch.nn.Module, images: torch.Tensor, batch: int = 250) -> torch.Tensor:
    """(2L, n, D): every block output's [CLS] token, then its mean patch token, in eval mode."""
    model.eval()
    p = model.num_prefix_tokens
    outs: list[torch.Tensor] = []
    hooks = [blk.register_forward_hook(lambda m, a, o: outs.append(o)) for blk in model.blocks]
    chunks = []
    for i in range(0, len(images), batch):
        outs.clear()
        model(images[i:i + batch])
        chunks.append(torch.stack([z[:, 0] for z in outs] + [z[:, p:].mean(1) for z in outs]))
    for h in hooks:
        h.remove()
    return torch.cat(chunks, 1)


def sklearn_accuracy(features: torch.Tensor, labels: torch.Tensor, train, test) -> np.ndarray:
    out = []
    for f in features.numpy():
        mu, sd = f[train].mean(0), f[train].std(0) + 1e-6
        clf = LogisticRegression(max_iter=2000).fit((f[train] - mu) / sd, labels[train].numpy())
        out.append(clf.score((f[test] - mu) / sd, labels[test].numpy()))
    return np.array(out)


def compare(name: str, features: torch.Tensor, labels: torch.Tensor, repeats: int) -> dict:
    train, test = split_indices(len(labels), 0.7, seed=0)
    variants = {"softmax": SOFTMAX_STEPS, "ridge": 0}
    times: dict[str, list[float]] = {v: [] for v in variants}
    accs = {v: probe_accuracy(features, labels, train, test, softmax_steps=s).numpy() for v, s in variants.items()}
    for _ in range(repeats):  # interleaved, so machine noise hits both alike
        for v, steps in variants.items():
            start = time.perf_counter()
            probe_accuracy(features, labels, train, test, softmax_steps=steps)
            times[v].append(time.perf_counter() - start)
    start = time.perf_counter()
    reference = sklearn_accuracy(features, labels, train, test)
    sklearn_s = time.perf_counter() - start
    median = {v: statistics.median(t) for v, t in times.items()}
    result = {"model": name, "problems": len(features), "images": len(labels), "train": len(train),
              "test": len(test), "dim": features.shape[-1], "softmax_steps": SOFTMAX_STEPS,
              "sklearn": reference.round(4).tolist(), "probe_stage_s": median,
              "time_ratio_softmax_vs_ridge": median["softmax"] / median["ridge"], "sklearn_s": sklearn_s}
    for v in variants:
        gap = (accs[v] - reference) * 100
        result[v] = {"accuracy": accs[v].round(4).tolist(), "gap_points": gap.round(2).tolist(),
                     "mean_gap": float(gap.mean()), "mean_abs_gap": float(np.abs(gap).mean()),
                     "worst_gap": float(gap.min())}
    print(f"{name}: {len(features)} probes, {len(train)}/{len(test)} images, D={features.shape[-1]}; "
          f"softmax − sklearn mean {result['softmax']['mean_gap']:+.2f} (|.| {result['softmax']['mean_abs_gap']:.2f}),"
          f" worst {result['softmax']['worst_gap']:+.2f}; ridge − sklearn mean {result['ridge']['mean_gap']:+.2f} "
          f"(|.| {result['ridge']['mean_abs_gap']:.2f}), worst {result['ridge']['worst_gap']:+.2f}; probe stage "
          f"{median['softmax'] * 1e3:.1f} vs {median['ridge'] * 1e3:.1f} ms "
          f"= {result['time_ratio_softmax_vs_ridge']:.2f}×")
    return result


def markdown(results: list[dict]) -> list[str]:
    """The RESULTS.md table: probe accuracy minus scikit-learn's per layer, and the probe-stage time ratio."""
    lines = ["| model | probes (images train/test) | isiwatch − sklearn: mean / mean \\|gap\\| / worst (points) | "
             "ridge only − sklearn | probe stage, isiwatch vs ridge only |", "|---|---|---|---|---|"]
    for r in results:
        ours, ridge = r["softmax"], r["ridge"]
        lines.append(f"| {r['model']} | {r['problems']} ({r['train']}/{r['test']}) | {ours['mean_gap']:+.2f} / "
                     f"{ours['mean_abs_gap']:.2f} / {ours['worst_gap']:+.2f} | {ridge['mean_gap']:+.2f} / "
                     f"{ridge['mean_abs_gap']:.2f} / {ridge['worst_gap']:+.2f} | "
                     f"{1e3 * r['probe_stage_s']['softmax']:.0f} vs {1e3 * r['probe_stage_s']['ridge']:.0f} ms "
                     f"(**{r['time_ratio_softmax_vs_ridge']:.2f}×**) |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="demo checkpoint (default: train the demo model)")
    parser.add_argument("--epochs", type=int, default=10, help="demo model training epochs without --checkpoint")
    parser.add_argument("--images", type=int, default=1000, help="held-out digits for the demo model")
    parser.add_argument("--vit-s-images", type=int, default=1000, help="digits through the random-init ViT-S/16")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="small models and sizes: checks the script in seconds")
    parser.add_argument("--out", type=Path, default=RESULTS)
    add_threads_argument(parser)
    args = parser.parse_args()
    threads = set_torch_threads(args.threads)
    images, labels = embedded_digits()
    held_x, held_y = images[DIGITS_TRAIN:], labels[DIGITS_TRAIN:]
    depth, size, epochs = (2, 32, 1) if args.tiny else (12, 224, args.epochs)
    if args.checkpoint:
        model = build_model(load_checkpoint(args.checkpoint))
    else:
        model, _ = make_digits_vit(0, depth=depth)
        train_classifier(model, images[:DIGITS_TRAIN], labels[:DIGITS_TRAIN], epochs=epochs)
    results = [compare(f"digits ViT (depth {len(model.blocks)}, width 64)",
                       block_features(model, held_x[:args.images]), held_y[:args.images], args.repeats)]
    torch.manual_seed(0)
    vit_s = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=10, img_size=size,
                              depth=depth)
    x = F.interpolate(held_x[:args.vit_s_images], size=size, mode="bilinear").expand(-1, 3, -1, -1)
    results.append(compare(f"random-init ViT-S/16 (depth {depth}) at {size} px", block_features(vit_s, x),
                           held_y[:args.vit_s_images], args.repeats))
    record = machine(threads)
    record["load_1min_end"] = round(current_load(), 2)
    write_json(args.out, {"machine": record, "tiny": args.tiny, "results": results, "markdown": markdown(results)})
    print("\n".join(markdown(results)))
    print(f"wrote {args.out} (torch threads {threads}, load {record['load_1min']} → {record['load_1min_end']})")


if __name__ == "__main__":
    main()
