"""What one Watch sample costs against a plain forward of its probe batch, on the CPU, in one run.

For timm's ViT-S/16 and ViT-B/16 at 224 px (random init, ``--images`` probe images with labels, default Watch
options): the best of ``--repeats`` interleaved runs of (a) a plain no-grad eval forward of the probe batch, (b) one
``Watch.sample`` and (c) ``isiwatch.analyze`` of the same images and labels, and the ratios b/a and c/a; the time of
each profiler range of one sample (``isiwatch.sample`` and inside it ``isiwatch.forward``, ``isiwatch.metrics``,
``isiwatch.probes``, ``isiwatch.host``; the metrics run inside the forward's hooks, so forward includes part of
them). Then the CPU proxies of GPU cost on vit_tiny at 224 px (`op_count.OpCount`): aten ops, kernel-launching ops
(not views) and scalar reads of one sample against a plain forward, at 16 and 128 probe images. Last (unless
``--no-precision``), the ``probe_dtype="bfloat16"`` probe pass against float32 on ViT-S/16: the largest difference
of each metric over the blocks, and both sample times.

    python benchmarks/bench_sample_cost.py [--threads 2] [--repeats 3] [--out results/sample_cost/sample_cost.json]

Run it alone: a 2-core machine with anything else running times that instead. ``--no-precision`` measures code
without the ``probe_dtype`` option (an older commit, for the figures before a change).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import timm
import torch

sys.path.insert(0, str(Path(__file__).parent))
from machine import machine  # noqa: E402
from op_count import OpCount  # noqa: E402
from profile_ranges import range_seconds  # noqa: E402

import isiwatch  # noqa: E402
from isiwatch._utils.files import write_json  # noqa: E402
from isiwatch._utils.threads import add_threads_argument, current_load, set_torch_threads  # noqa: E402

RESULT = Path(__file__).parent / "results" / "sample_cost" / "sample_cost.json"
TIMED = {"vit_small": "vit_small_patch16_224", "vit_base": "vit_base_patch16_224"}


def probe_batch(count: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(count, 3, 224, 224, generator=gen), torch.arange(count) % 10


def model(arch: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(arch, num_classes=10).eval()


def best_interleaved(fns: dict, repeats: int) -> dict[str, float]:
    """Best wall time of each function over ``repeats`` rounds, the functions alternating within each round."""
    for fn in fns.values():
        fn()  # warm-up
    best = {name: float("inf") for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def timed_model(name: str, arch: str, images: int, repeats: int) -> dict:
    net = model(arch)
    x, y = probe_batch(images)
    watch = isiwatch.Watch(net, x, y, every_n_steps=1)
    steps = iter(range(1, 10_000))

    def forward() -> None:
        with torch.no_grad():
            net(x)

    best = best_interleaved({"forward": forward, "sample": lambda: watch.sample(next(steps)),
                             "analyze": lambda: isiwatch.analyze(net, x, y)}, repeats)
    parts = range_seconds(lambda: watch.sample(next(steps)))
    watch.close(final_sample=False)
    out = {"arch": arch, "probe_images": images, "forward_s": best["forward"], "sample_s": best["sample"],
           "analyze_s": best["analyze"], "sample_over_forward": best["sample"] / best["forward"],
           "analyze_over_forward": best["analyze"] / best["forward"], "sample_parts_s": parts}
    print(f"{name}: forward {best['forward']:.3f} s, sample {best['sample']:.3f} s "
          f"({out['sample_over_forward']:.2f}x), analyze {best['analyze']:.3f} s ({out['analyze_over_forward']:.2f}x); "
          + ", ".join(f"{k.removeprefix('isiwatch.')} {v:.3f} s" for k, v in parts.items()), flush=True)
    return out


def op_counts(images: int) -> dict:
    """Ops, launches and scalar reads of one vit_tiny sample and of a plain forward, ``images`` probe images."""
    net = model("vit_tiny_patch16_224")
    x, y = probe_batch(images)
    with OpCount() as fwd, torch.no_grad():
        net(x)
    watch = isiwatch.Watch(net, x, y, every_n_steps=1)
    watch.sample(0)  # the first sample makes what a probe batch keeps (device copies, constants)
    with OpCount() as sample:
        watch.sample(1, torch.tensor(1.0))
    watch.close(final_sample=False)
    return {"images": images, "forward_ops": fwd.ops, "forward_launches": fwd.launches, "sample_ops": sample.ops,
            "sample_launches": sample.launches, "ops_ratio": sample.ops / fwd.ops,
            "launches_ratio": sample.launches / fwd.launches, "scalar_reads": sample.scalar_reads,
            "sync_ops": dict(sample.syncs), "host_reads": dict(sample.reads)}


def precision(repeats: int) -> dict:
    """``probe_dtype="bfloat16"`` against float32 on ViT-S/16: each metric's largest difference over the blocks,
    and the best sample times."""
    net = model(TIMED["vit_small"])
    x, y = probe_batch(32)
    watches = {"float32": isiwatch.Watch(net, x, y, every_n_steps=1),
               "bfloat16": isiwatch.Watch(net, x, y, every_n_steps=1, probe_dtype="bfloat16")}
    steps = iter(range(1, 10_000))
    best = best_interleaved({k: (lambda w=w: w.sample(next(steps))) for k, w in watches.items()}, repeats)
    layers = {k: w.history[-1].layers for k, w in watches.items()}
    for w in watches.values():
        w.close(final_sample=False)
    diff = {m: max(abs(a - b) for a, b in zip(layers["float32"][m], layers["bfloat16"][m]))
            for m in layers["float32"]}
    print("bfloat16 - float32, largest |difference| per metric: "
          + ", ".join(f"{m} {v:.4f}" for m, v in diff.items()), flush=True)
    return {"arch": TIMED["vit_small"], "probe_images": 32, "sample_s": best, "max_abs_difference": diff}


def _ratio(value: float) -> str:
    return f"{value:.2f}×" if value < 10 else f"{value:.1f}×"


def tables(now: dict, before: dict | None = None) -> list[str]:
    """Markdown of a run (``now``) beside an earlier commit's (``before``, None: none): the op and read counts on
    vit_tiny, the CPU times on ViT-S and ViT-B with the parts of one sample, and the bf16 probe pass."""
    runs = [r for r in (before, now) if r is not None]
    heads = " | ".join(f"`{r['commit']}`" for r in runs)
    lines = [f"| vit_tiny, 224 px, one sample against a plain forward | {heads} | goal |",
             "|---|" + "---|" * len(runs) + "---|"]
    for i, images in enumerate((16, 128)):
        lines.append(f"| aten ops, {images} probe images | "
                     + " | ".join(f"{_ratio(r['ops'][i]['ops_ratio'])} ({r['ops'][i]['sample_ops']:,} / "
                                  f"{r['ops'][i]['forward_ops']:,})" for r in runs) + " | ≤ 4× |")
    lines.append("| ops growth from 16 to 128 images | "
                 + " | ".join(_ratio(r["ops_growth_16_to_128"]) for r in runs) + " | ≤ 1.1× |")
    for i, images in enumerate((16, 128)):
        lines.append(f"| kernel-launching ops (not views), {images} images | "
                     + " | ".join(_ratio(r["ops"][i]["launches_ratio"]) for r in runs) + " | – |")
    lines.append("| scalar reads per sample (sync-capable ops and host reads) | "
                 + " | ".join(" / ".join(str(c["scalar_reads"]) for c in r["ops"]) for r in runs) + " | ≤ 2 |")
    lines += ["", f"| CPU, {next(iter(now['timed'].values()))['probe_images']} probe images, best of each | "
              "commit | plain forward | sample | sample / forward (goal ≤ 1.3×) | `analyze` | `analyze` / forward "
              "(goal ≤ 1.25×) |", "|---|---|---|---|---|---|---|"]
    for name in now["timed"]:
        for r in runs:
            t = r["timed"].get(name)
            if t:
                lines.append(f"| {t['arch']} | `{r['commit']}` | {t['forward_s']:.2f} s | {t['sample_s']:.2f} s | "
                             f"**{t['sample_over_forward']:.2f}×** | {t['analyze_s']:.2f} s | "
                             f"**{t['analyze_over_forward']:.2f}×** |")
    lines += ["", "One sample's profiler ranges (seconds; `isiwatch.metrics` runs inside the forward's hooks, so "
              "`isiwatch.forward` holds it):", ""]
    for t in now["timed"].values():
        lines.append(f"- {t['arch']}: " + ", ".join(f"`{k}` {v:.3f}" for k, v in t["sample_parts_s"].items()))
    precision = now.get("precision")
    if precision:
        times = precision["sample_s"]
        lines += ["", f"`probe_dtype=\"bfloat16\"` on {precision['arch']} ({precision['probe_images']} probe "
                  f"images, random init, random images): a sample {times['bfloat16']:.2f} s against "
                  f"{times['float32']:.2f} s in float32; the largest difference of each metric over the blocks: "
                  + ", ".join(f"{m} {v:.1e}" for m, v in precision["max_abs_difference"].items()) + "."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_threads_argument(parser)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--models", nargs="+", default=list(TIMED), choices=list(TIMED))
    parser.add_argument("--no-precision", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULT)
    args = parser.parse_args()
    threads = set_torch_threads(args.threads or 2)
    load_before = current_load()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(isiwatch.__file__).parent).stdout.strip()
    result: dict = {"commit": commit, "machine": machine(threads), "load_before": load_before,
                    "ops": [op_counts(n) for n in (16, 128)]}
    small, large = result["ops"]
    result["ops_growth_16_to_128"] = large["sample_ops"] / small["sample_ops"]
    print("ops: " + "; ".join(f"{c['images']} images: sample {c['sample_ops']} ops / forward {c['forward_ops']} = "
                              f"{c['ops_ratio']:.1f}x, launches {c['launches_ratio']:.1f}x, "
                              f"scalar reads {c['scalar_reads']}" for c in result["ops"]), flush=True)
    result["timed"] = {name: timed_model(name, TIMED[name], args.images, args.repeats) for name in args.models}
    if not args.no_precision:
        result["precision"] = precision(args.repeats)
    result["load_after"] = current_load()
    result["markdown"] = tables(result)
    write_json(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
