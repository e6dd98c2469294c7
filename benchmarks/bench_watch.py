"""Watch overhead at every_n_steps=100, side by side with the same training loop without Watch.

Trains the demo ViT (depth 12, width 64, batch 128) on the embedded digits in interleaved rounds
(plain, watched, plain, watched, ...) so that machine noise hits both alike; reports total wall times,
the overhead ratio, and the per-sample probe cost against the cost of 100 training steps. After each round it
also times one plain eval forward of the probe batch (no hooks, no metrics, no probes): the floor any probe pass
costs, reported in the same units.

    python benchmarks/bench_watch.py [--rounds 3] [--steps 200] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import statistics
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
    watch = Watch(watched_model, probe_x.to(args.device), probe_y.to(args.device), every_n_steps=args.every,
                  registry=CollectorRegistry(), run_name="bench")
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
    watch.close()
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
                          "markdown": markdown})


if __name__ == "__main__":
    main()
