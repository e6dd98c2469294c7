"""Watch overhead at every_n_steps=100, side by side with the same training loop without Watch.

Trains the demo ViT (depth 12, width 64, batch 128) on the embedded digits in interleaved rounds
(plain, watched, plain, watched, ...) so that machine noise hits both alike; the watched arm runs with the default
options and a ``log_dir`` (TensorBoard with its heat-maps, ``metrics.jsonl``), as a real run has it. Reports total
wall times, the overhead ratio, the Watch's own ``overhead/ratio`` series, and the per-sample probe cost against the
cost of 100 training steps. After each round it also times one plain eval forward of the probe batch (no hooks, no
metrics, no probes): the floor any probe pass costs. ``floor_ratio`` is one sample over that forward, on the demo
model and (``--vit-probe-images``, 0 to skip) on timm's ViT-S/16 at 224 px, random init.

    python benchmarks/bench_watch.py [--rounds 3] [--steps 200] [--threads N] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from machine import machine
from prometheus_client import CollectorRegistry

from isiwatch import Watch
from isiwatch._utils.files import write_json
from isiwatch._utils.threads import add_threads_argument, current_load, set_torch_threads
from isiwatch.io.data import DIGITS_TRAIN, embedded_digits
from isiwatch.truncation.cost import measure_latency
from isiwatch.truncation.healing import make_digits_vit

RESULT = Path(__file__).parent / "results" / "watch" / "watch.json"


def run(model, optimizer, x, y, steps, start_step, device, watch=None, batch=128):
    gen = torch.Generator().manual_seed(start_step)
    if device == "cuda":
        torch.cuda.synchronize()
    begin = time.perf_counter()
    for step in range(start_step, start_step + steps):
        idx = torch.randint(0, len(x), (batch,), generator=gen)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if watch is not None:
            watch.step(step, loss)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - begin


def vit_small_floor(images: int, samples: int, device: str) -> dict[str, float]:
    """One Watch sample (default options) over one plain eval forward of the same probe batch, on timm's
    ``vit_small_patch16_224`` (random init) with ``images`` random 224-px probe images: medians of ``samples``."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_small_patch16_224", pretrained=False).to(device)
    probe_x = torch.randn(images, 3, 224, 224, device=device)
    probe_y = torch.arange(images, device=device) % 10
    watch = Watch(model, probe_x, probe_y, every_n_steps=1, registry=CollectorRegistry(), run_name="vit-s")
    watch.sample(0)  # warm-up
    sample_s = []
    for step in range(1, samples + 1):
        watch.sample(step)
        sample_s.append(watch.history[-1].duration_s)
    watch.close(final_sample=False)
    forward_s = measure_latency({"plain": model}, probe_x, warmup=1, rounds=samples)["plain"] / 1e3
    return {"probe_images": images, "sample_s": statistics.median(sample_s), "forward_s": forward_s,
            "floor_ratio": statistics.median(sample_s) / forward_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200, help="training steps per round and arm")
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--probe-images", type=int, default=256)
    parser.add_argument("--out", type=Path, default=RESULT)
    add_threads_argument(parser)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", default="digits", choices=["digits", "vit_base"],
                        help="digits: the demo ViT on 28×28 digits; vit_base: ViT-B/16 at 224 px (GPU)")
    parser.add_argument("--vit-probe-images", type=int, default=256,
                        help="probe images for the ViT-S/16 floor ratio (0: skip it)")
    parser.add_argument("--vit-samples", type=int, default=3, help="timed samples for the ViT-S/16 floor ratio")
    args = parser.parse_args()
    threads = set_torch_threads(args.threads)
    record = machine(threads, args.device)
    images, labels = embedded_digits()
    if args.model == "vit_base":
        import timm

        images = F.interpolate(images[:2048], size=224).expand(-1, 3, -1, -1).contiguous()
        labels = labels[:2048]
        models = [timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=10) for _ in range(2)]
        train_count, batch = 1792, 64
    else:
        models = [make_digits_vit(0)[0] for _ in range(2)]
        train_count, batch = DIGITS_TRAIN, 128
    x, y = images[:train_count].to(args.device), labels[:train_count].to(args.device)
    probe_x, probe_y = images[train_count:train_count + args.probe_images], labels[train_count:][:args.probe_images]
    plain_model, watched_model = (m.to(args.device).train() for m in models)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (plain_model, watched_model)]
    log_dir = tempfile.TemporaryDirectory(prefix="bench_watch_")
    watch = Watch(watched_model, probe_x.to(args.device), probe_y.to(args.device), every_n_steps=args.every,
                  registry=CollectorRegistry(), run_name="bench", log_dir=log_dir.name)
    print(f"device {args.device}, torch {torch.__version__}, {threads} threads, model {args.model}, "
          f"every_n_steps={args.every}, {args.probe_images} probe images")
    plain_times, watched_times, forward_times = [], [], []
    probe_on_device = probe_x.to(args.device)
    step = 1
    run(plain_model, opts[0], x, y, 5, 10_000, args.device, batch=batch)  # warm-up
    run(watched_model, opts[1], x, y, 5, 10_000, args.device, batch=batch)
    for r in range(args.rounds):
        plain_times.append(run(plain_model, opts[0], x, y, args.steps, step, args.device, batch=batch))
        watched_times.append(run(watched_model, opts[1], x, y, args.steps, step, args.device, watch, batch))
        forward_times.append(measure_latency({"plain": plain_model}, probe_on_device, warmup=0,
                                             rounds=3)["plain"] / 1e3)
        step += args.steps
        print(f"round {r + 1}: plain {plain_times[-1]:.2f} s, watched {watched_times[-1]:.2f} s")
    samples = [s.duration_s for s in watch.history]
    charged = [s.overhead_s for s in watch.history if s.overhead_s is not None]
    ratios = [s.overhead_ratio for s in watch.history if s.overhead_ratio is not None]
    watch.close()
    log_dir.cleanup()
    plain, watched = sum(plain_times), sum(watched_times)
    step_time = statistics.median(plain_times) / args.steps
    overhead = 100 * (watched / plain - 1)
    per_sample = 100 * statistics.median(samples) / (step_time * args.every)
    floor = 100 * statistics.median(forward_times) / (step_time * args.every)
    print(f"total: plain {plain:.2f} s, watched {watched:.2f} s, overhead {overhead:+.2f} %")
    print(f"samples: {len(samples)}, median probe pass + metrics + probes {1e3 * statistics.median(samples):.1f} ms; "
          f"{args.every} training steps take {1e3 * step_time * args.every:.0f} ms -> per-sample cost "
          f"{per_sample:.2f} % of training time; one plain forward of the probe batch "
          f"{1e3 * statistics.median(forward_times):.1f} ms = {floor:.2f} %")
    floor_ratio = statistics.median(samples) / statistics.median(forward_times)
    print(f"floor ratio ({args.model}): one sample / one plain forward of the probe batch = {floor_ratio:.2f}; "
          f"with its exports {statistics.median(charged) / statistics.median(forward_times):.2f}")
    vit_small = vit_small_floor(args.vit_probe_images, args.vit_samples, args.device) if args.vit_probe_images \
        else None
    if vit_small:
        print(f"floor ratio (ViT-S/16, 224 px, {args.vit_probe_images} probe images): "
              f"{vit_small['floor_ratio']:.2f} ({1e3 * vit_small['sample_s']:.0f} ms / "
              f"{1e3 * vit_small['forward_s']:.0f} ms)")
    record["load_1min_end"] = round(current_load(), 2)
    sample_ms, steps_ms = 1e3 * statistics.median(samples), 1e3 * step_time * args.every
    forward_ms = 1e3 * statistics.median(forward_times)
    markdown = ["| model | rounds × steps per arm | plain | watched | overhead (total times) | median sample | "
                f"{args.every} training steps | sample cost per {args.every} steps | plain forward of the probe batch "
                "(the floor) |",
                "|---|---|---|---|---|---|---|---|---|",
                f"| {args.model} | {args.rounds} × {args.steps} | {plain:.2f} s | {watched:.2f} s | "
                f"{overhead:+.2f} % | {sample_ms:.0f} ms | {steps_ms:,.0f} ms | **{per_sample:.2f} %** | "
                f"{forward_ms:.0f} ms = {floor:.2f} % |"]
    write_json(args.out, {"machine": record, "args": {k: str(v) for k, v in vars(args).items()},
                          "plain_s": plain_times, "watched_s": watched_times,
                          "sample_s": samples, "step_s": step_time, "overhead_pct": overhead,
                          "per_sample_pct": per_sample, "probe_forward_s": forward_times, "floor_pct": floor,
                          "log_dir": True, "floor_ratio": floor_ratio,
                          "floor_ratio_with_exports": statistics.median(charged) / statistics.median(forward_times),
                          "overhead_s": charged, "overhead_ratio_series": ratios,
                          "overhead_ratio_median": statistics.median(ratios) if ratios else None,
                          "vit_small": vit_small, "markdown": markdown})


if __name__ == "__main__":
    main()
