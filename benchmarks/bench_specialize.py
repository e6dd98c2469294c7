"""Token-specialised norms / QKV (``isiwatch.specialization.convert``) on the embedded digits: does the remedy help?

For each seed, four variants start from the same initial weights (``make_digits_vit(seed)``, then
``specialize``) and train with the same data order, schedule and number of steps:
``baseline``, ``norms`` (norm1/norm2), ``norms+qkv`` (plus a full QKV copy in the first third of the
blocks) and ``norms+lora`` (plus a rank-8 LoRA QKV update there). Reported on the 1,000 held-out digits:

- classification accuracy;
- a dense proxy: a per-patch linear probe predicting each 7×7 patch's own ink-density bin from that
  patch's final token (``forward_features``, after the final norm). Ink density = mean raw pixel
  intensity in [0, 1] of the patch; bins ``blank < 0.05 ≤ light < 0.17 ≤ medium < 0.33 ≤ dense`` (the
  non-blank edges are the tertiles of the training patches; blank is 53 % of patches). Closed-form ridge
  (``isiwatch.measure.ridge.fit_ridge``) on the 64,000 training-image patches, regulariser by leave-one-out,
  scored on the 16,000 held-out patches; a probe on the patch position alone is the floor;
- ``norm_friction`` per block (``isiwatch.analyze`` on 500 held-out digits), max over blocks;
- parameter and FLOP overhead (``torch.utils.flop_counter.FlopCounterMode``, one image) on the benched
  model and on timm ViT-S/16 and ViT-B/16 at 224 px, and the forward latency ratio (batch 256).

Means over seeds with 95 % Student-t intervals; Δ columns are paired per seed (same init and data order).

    python benchmarks/bench_specialize.py --seeds 3 --epochs 4 --depth 4   # writes results/specialize/specialize.json
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import timm
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).parent))
import intervals  # noqa: E402
from machine import machine  # noqa: E402

from isiwatch import analyze  # noqa: E402
from isiwatch._utils.files import write_json  # noqa: E402
from isiwatch._utils.threads import add_threads_argument, current_load, set_torch_threads  # noqa: E402
from isiwatch.io.data import DIGITS_TRAIN, MNIST_MEAN, MNIST_STD, embedded_digits  # noqa: E402
from isiwatch.measure.ridge import accuracy_score, fit_ridge  # noqa: E402
from isiwatch.specialization.convert import parameter_overhead, specialize  # noqa: E402
from isiwatch.truncation.healing import accuracy, make_digits_vit, train_classifier  # noqa: E402

RESULT = Path(__file__).parent / "results" / "specialize" / "specialize.json"
VARIANTS = {
    "baseline": None,
    "norms": {"norms": True},
    "norms+qkv": {"norms": True, "qkv_blocks": "first_third"},
    "norms+lora": {"norms": True, "qkv_blocks": "first_third", "lora_rank": 8},
}
#: Ink-density bin edges (mean raw intensity of a 7×7 patch).
DENSITY_EDGES = (0.05, 0.17, 0.33)
PATCH = 7
#: This script's intervals: 2 decimals, tabled t quantiles, "± nan" with one seed.
fmt = partial(intervals.fmt, digits=2, quantile=intervals.t95_table, single=math.nan)


def density_bins(images: torch.Tensor) -> torch.Tensor:
    """(n,1,28,28) normalised digits → (n, 16) ink-density bin of each patch, row-major like timm's tokens."""
    raw = images * MNIST_STD + MNIST_MEAN
    density = F.avg_pool2d(raw, PATCH).flatten(1)
    return torch.bucketize(density, torch.tensor(DENSITY_EDGES), right=True)


def ridge_accuracy(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor) -> float:
    classes = int(max(train_y.max(), test_y.max())) + 1
    fit = fit_ridge(train_x[None], F.one_hot(train_y, classes).float(), lambda p: accuracy_score(p, train_y))
    return float(accuracy_score(fit.predict(test_x[None]), test_y))


@torch.no_grad()
def patch_tokens(model: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
    """Final patch tokens (n·N, D) of ``forward_features`` (prefix tokens dropped)."""
    model.eval()
    feats = torch.cat([model.forward_features(images[i:i + 500]) for i in range(0, len(images), 500)])
    return feats[:, model.num_prefix_tokens:].reshape(-1, feats.shape[-1])


def dense_probe(model, x_train, x_test, bins_train, bins_test) -> float:
    return ridge_accuracy(patch_tokens(model, x_train), bins_train.flatten(), patch_tokens(model, x_test),
                          bins_test.flatten())


def position_floor(bins_train: torch.Tensor, bins_test: torch.Tensor) -> float:
    """Dense-probe accuracy from the patch position alone (one-hot), the floor a token must beat."""
    n_pos = bins_train.shape[1]

    def positions(n: int) -> torch.Tensor:
        return torch.eye(n_pos).repeat(n, 1)

    return ridge_accuracy(positions(len(bins_train)), bins_train.flatten(), positions(len(bins_test)),
                          bins_test.flatten())


def flops(model: torch.nn.Module, image: torch.Tensor) -> int:
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model.eval()(image)
    return counter.get_total_flops()


def overhead(arch: str, kwargs: dict, image: torch.Tensor) -> dict:
    """Parameter and FLOP overhead of every variant on one (untrained) architecture."""
    rows = {}
    for name, options in VARIANTS.items():
        torch.manual_seed(0)
        model = timm.create_model(arch, pretrained=False, **kwargs)
        if options:
            specialize(model, **options)
        rows[name] = {**parameter_overhead(model), "flops": flops(model, image)}
    return rows


@torch.no_grad()
def latency_ratios(kwargs: dict, images: torch.Tensor, repeats: int = 7) -> dict:
    """Median forward time of each variant / baseline, interleaved to share the machine's load."""
    models = {}
    for name, options in VARIANTS.items():
        model, _ = make_digits_vit(0, **kwargs)
        models[name] = specialize(model, **options) if options else model
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(repeats):
        for name, model in models.items():
            start = time.perf_counter()
            model.eval()(images)
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["baseline"])
    return {name: statistics.median(t) / base for name, t in times.items()}


def run_one(seed: int, name: str, kwargs: dict, epochs: int, data: dict) -> dict:
    model, _ = make_digits_vit(seed, **kwargs)
    if VARIANTS[name]:
        specialize(model, **VARIANTS[name])
    start = time.perf_counter()
    train_classifier(model, data["x_train"], data["y_train"], epochs=epochs, seed=seed)
    seconds = time.perf_counter() - start
    friction = analyze(model, data["x_test"][:500]).layers["norm_friction"]
    return {"seed": seed, "variant": name, "accuracy": accuracy(model, data["x_test"], data["y_test"]),
            "dense": dense_probe(model, data["x_train"], data["x_test"], data["bins_train"], data["bins_test"]),
            "friction": friction, "train_seconds": seconds}


def table(results: list[dict], digits_overhead: dict, latency: dict) -> str:
    by = {name: sorted((r for r in results if r["variant"] == name), key=lambda r: r["seed"]) for name in VARIANTS}
    base = by["baseline"]
    lines = ["| variant | params added | FLOPs ratio | latency ratio | accuracy % | Δ acc (paired) | dense probe % "
             "| Δ dense (paired) | max norm_friction |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, rows in by.items():
        over = digits_overhead[name]
        d_acc = [r["accuracy"] - b["accuracy"] for r, b in zip(rows, base)]
        d_dense = [r["dense"] - b["dense"] for r, b in zip(rows, base)]
        lines.append(
            f"| {name} | {over['added']:,} ({100 * over['fraction']:.2f} %) "
            f"| {over['flops'] / digits_overhead['baseline']['flops']:.4f} | {latency[name]:.2f} "
            f"| {fmt([r['accuracy'] for r in rows])} | {fmt(d_acc, signed=True)} "
            f"| {fmt([r['dense'] for r in rows])} | {fmt(d_dense, signed=True)} "
            f"| {fmt([max(r['friction']) for r in rows], scale=1.0, digits=4)} |")
    return "\n".join(lines)


def overhead_table(rows_by_arch: dict) -> str:
    lines = ["| model | variant | base params | added | added % | FLOPs ratio |", "|---|---|---|---|---|---|"]
    for arch, rows in rows_by_arch.items():
        for name, row in rows.items():
            lines.append(f"| {arch} | {name} | {row['base']:,} | {row['added']:,} | {100 * row['fraction']:.2f} "
                         f"| {row['flops'] / rows['baseline']['flops']:.5f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--out", type=Path, default=RESULT, help="where the results go as JSON")
    add_threads_argument(parser)
    args = parser.parse_args()
    record = machine(set_torch_threads(args.threads))
    kwargs = {"depth": args.depth}

    images, labels = embedded_digits()
    data = {"x_train": images[:DIGITS_TRAIN], "y_train": labels[:DIGITS_TRAIN],
            "x_test": images[DIGITS_TRAIN:], "y_test": labels[DIGITS_TRAIN:]}
    data["bins_train"], data["bins_test"] = density_bins(data["x_train"]), density_bins(data["x_test"])
    floor = position_floor(data["bins_train"], data["bins_test"])
    majority = float((data["bins_test"] == data["bins_train"].flatten().mode().values).float().mean())

    digits_model, digits_kwargs = make_digits_vit(0, **kwargs)
    arch_overhead = {
        f"digits ViT (depth {args.depth}, width 64)": overhead(
            "vit_tiny_patch16_224", digits_kwargs, images[:1]),
        "vit_small_patch16_224": overhead("vit_small_patch16_224", {}, torch.randn(1, 3, 224, 224)),
        "vit_base_patch16_224": overhead("vit_base_patch16_224", {}, torch.randn(1, 3, 224, 224)),
    }
    latency = latency_ratios(kwargs, images[:256])
    init_friction = analyze(digits_model, data["x_test"][:500]).layers["norm_friction"]
    print(f"init norm_friction (seed 0): {[round(v, 4) for v in init_friction]}", flush=True)

    results = []
    start = time.perf_counter()
    for seed in range(args.seeds):
        for name in VARIANTS:
            results.append(run_one(seed, name, kwargs, args.epochs, data))
            r = results[-1]
            print(f"seed {seed} {name:11s} acc {r['accuracy']:.4f} dense {r['dense']:.4f} "
                  f"friction {[round(v, 4) for v in r['friction']]} ({r['train_seconds']:.0f} s train)", flush=True)
    wall = time.perf_counter() - start

    steps = args.epochs * math.ceil(DIGITS_TRAIN / 128)
    lines = [f"{args.seeds} seeds × {len(VARIANTS)} variants, depth {args.depth}, width 64, {args.epochs} epochs "
             f"({steps} AdamW steps, batch 128, one-cycle lr 2e-3) each; {wall / 60:.1f} min of training + probes.",
             "", f"Dense-probe floors: position only {100 * floor:.2f} %, majority bin {100 * majority:.2f} %.", "",
             table(results, arch_overhead[next(iter(arch_overhead))], latency), "", overhead_table(arch_overhead)]
    print("\n" + "\n".join(lines))
    record["load_1min_end"] = round(current_load(), 2)
    write_json(args.out, {"args": {k: str(v) for k, v in vars(args).items()}, "results": results,
                          "overhead": arch_overhead, "latency": latency, "init_friction": init_friction,
                          "position_floor": floor, "majority": majority, "minutes": wall / 60, "machine": record,
                          "markdown": "\n".join(lines).split("\n")})


if __name__ == "__main__":
    main()
