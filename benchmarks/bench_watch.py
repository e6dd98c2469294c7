"""Watch overhead at every_n_steps=100, side by side with the same training loop without Watch.

Trains the demo ViT (depth 12, width 64, batch 128) on the embedded digits in interleaved rounds, the arms' order
alternating (plain then watched, watched then plain, ...) so that machine noise and drift hit both alike; the watched
arm runs with the default options and a ``log_dir`` (TensorBoard with its heat-maps, ``metrics.jsonl``), as a real
run has it. Reports total wall times and the whole-run ratio, the Watch's own ``overhead/ratio`` series, the
per-sample cost against the cost of 100 training steps, where the rest of the whole-run difference goes (the
Watch's start and close, timed outside the rounds, and the training steps right after a sample against the others),
and after each round one plain eval forward of the probe batch (no hooks, no metrics, no probes): the floor any
probe pass costs. ``floor_ratio`` is one sample over that forward, measured in ``--floor-pairs`` interleaved pairs of
one sample and one forward after the rounds (the machine's drift hits both alike; on the demo model each round also
takes a sample without the linear probes, ``floor_ratio_without_probes``), on the demo model and
(``--vit-probe-images``, 0 to skip) on timm's ViT-S/16 at 224 px, random init. Last, ``--rss-samples`` samples
(0 to skip) of a Watch on the demo model with a ``log_dir`` and default options (heat-maps every ``heatmap_every``
samples), in a fresh process: its RSS and C-heap bytes in use every ``--rss-every`` samples, and their growth once
the history is full.

    python benchmarks/bench_watch.py [--rounds 4] [--steps 200] [--threads N] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

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
from isiwatch.watch.exporters import TensorBoardExporter

RESULT = Path(__file__).parent / "results" / "watch" / "watch.json"


def run(model, optimizer, x, y, steps, start_step, device, watch=None, batch=128, step_times=None):
    """Train ``steps`` steps from ``start_step``; the wall time in seconds. ``step_times`` (a list) receives each
    step's wall time, the Watch's ``step()`` included."""
    gen = torch.Generator().manual_seed(start_step)
    if device == "cuda":
        torch.cuda.synchronize()
    begin = last = time.perf_counter()
    for step in range(start_step, start_step + steps):
        idx = torch.randint(0, len(x), (batch,), generator=gen)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if watch is not None:
            watch.step(step, loss)
        if step_times is not None:
            now = time.perf_counter()
            step_times.append(now - last)
            last = now
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - begin


def after_sample_slowdown(step_times: list[float], plain_step_s: float, every: int, start_step: int,
                          window: int = 5) -> dict[str, float | None]:
    """Median training-step time (the Watch's ``step()`` included) in the ``window`` steps after each sampling step
    and in the other non-sampling steps, each over the plain arm's median step: 1.0 when a sample leaves nothing
    behind and non-sampling steps cost nothing."""
    after, others = [], []
    for i, seconds in enumerate(step_times):
        step = start_step + i
        if step % every == 0:
            continue
        (after if step % every <= window else others).append(seconds)
    return {"after_sample": statistics.median(after) / plain_step_s if after else None,
            "other_steps": statistics.median(others) / plain_step_s if others else None}


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2``."""

    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def malloc_in_use_bytes() -> int | None:
    """Bytes the C heap has handed out and not taken back (glibc's ``mallinfo2``; None elsewhere): unlike the RSS,
    blind to freed memory that malloc keeps, so growth here is memory still held."""
    try:
        info = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    info.restype = MallInfo2
    held = info()
    return held.uordblks + held.hblkhd


def rss_over_samples(samples: int, probe_images: int, device: str, threads: int, every: int = 100) -> dict[str, Any]:
    """:func:`_rss_over_samples` in a fresh process: the memory the benchmark's earlier parts freed (ViT-S/16's
    activations) would otherwise come and go in this process's RSS readings."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_rss_over_samples, (samples, probe_images, device, threads, every))


def _rss_over_samples(samples: int, probe_images: int, device: str, threads: int, every: int) -> dict[str, Any]:
    """RSS and C-heap bytes in use (MB) every ``every`` samples over ``samples`` samples of a Watch (default options,
    a ``log_dir``, every step a sample) on the demo model, and their growth from the checkpoint at which the history
    was full (the first, if the run is shorter than the history) to the last, heat-map renders written first."""
    set_torch_threads(threads)
    images, labels = embedded_digits()
    model = make_digits_vit(0)[0].to(device)
    with tempfile.TemporaryDirectory(prefix="bench_watch_rss_") as log_dir:
        watch = Watch(model, images[:probe_images].to(device), labels[:probe_images].to(device), every_n_steps=1,
                      registry=CollectorRegistry(), run_name="rss", log_dir=log_dir)
        tensorboard = next(e for e in watch.exporters if isinstance(e, TensorBoardExporter))
        filled = min(watch.options.history_size, samples)
        start = max(every, filled - filled % every)
        rss_mb: dict[int, float] = {}
        in_use_mb: dict[int, float] = {}
        for step in range(1, samples + 1):
            watch.step(step)
            if step % every == 0 or step == samples:
                tensorboard.wait_for_heatmaps()
                rss_mb[step] = rss_bytes() / 2**20
                in_use = malloc_in_use_bytes()
                if in_use is not None:
                    in_use_mb[step] = in_use / 2**20
        watch.close()
    start = min(start, samples)
    return {"samples": samples, "probe_images": probe_images, "history_size": watch.options.history_size,
            "heatmap_every": watch.options.heatmap_every, "rss_mb": rss_mb, "from_sample": start,
            "growth_mb": rss_mb[samples] - rss_mb[start], "malloc_in_use_mb": in_use_mb or None,
            "in_use_growth_mb": in_use_mb[samples] - in_use_mb[start] if in_use_mb else None}


def floor_pairs(watch: Watch, model: torch.nn.Module, probe_x: torch.Tensor, pairs: int,
                first_step: int, without_probes: Watch | None = None) -> dict[str, Any]:
    """``pairs`` rounds of one Watch sample and one plain eval forward of the same probe batch (no hooks, no
    metrics, no probes), interleaved so that the machine's drift hits both alike, their order rotating: the
    medians and the floor ratio, one sample's measurement over one forward. With ``without_probes`` (a Watch whose
    ``probe_every`` skips the probes after its first sample), each round also takes one of its samples: the floor
    ratio of a sample without the linear probes."""
    samplers = {"sample": watch} | ({"without_probes": without_probes} if without_probes is not None else {})
    arms = ["forward", *samplers]
    times: dict[str, list[float]] = {arm: [] for arm in arms}
    for i in range(pairs):
        for arm in arms[i % len(arms):] + arms[:i % len(arms)]:
            if arm == "forward":
                times[arm].append(measure_latency({"plain": model}, probe_x, warmup=0, rounds=1)["plain"] / 1e3)
            else:
                sampler = samplers[arm]
                sampler.sample(first_step + i)
                layers = sampler.history[-1].layers
                if (arm == "sample") != any(metric.startswith("probe_") for metric in layers):
                    raise RuntimeError(f"the {arm} arm's sample has the metrics {sorted(layers)}")
                times[arm].append(sampler.history[-1].duration_s)
    forward_s = statistics.median(times["forward"])
    out = {"pairs": pairs, "sample_s": statistics.median(times["sample"]), "forward_s": forward_s,
           "floor_ratio": statistics.median(times["sample"]) / forward_s}
    if without_probes is not None:
        out |= {"sample_without_probes_s": statistics.median(times["without_probes"]),
                "floor_ratio_without_probes": statistics.median(times["without_probes"]) / forward_s}
    return out


def vit_small_floor(images: int, pairs: int, device: str) -> dict[str, Any]:
    """:func:`floor_pairs` of a Watch (default options) on timm's ``vit_small_patch16_224`` (random init) with
    ``images`` random 224-px probe images."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_small_patch16_224", pretrained=False).to(device)
    probe_x = torch.randn(images, 3, 224, 224, device=device)
    probe_y = torch.arange(images, device=device) % 10
    watch = Watch(model, probe_x, probe_y, every_n_steps=1, registry=CollectorRegistry(), run_name="vit-s")
    watch.sample(0)  # warm-up
    floor = floor_pairs(watch, model, probe_x, pairs, 1)
    watch.close(final_sample=False)
    return {"probe_images": images, **floor}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="rounds per arm (even: each arm goes first as often)")
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
    parser.add_argument("--vit-samples", type=int, default=3, help="sample/forward pairs for the ViT-S/16 floor ratio")
    parser.add_argument("--floor-pairs", type=int, default=10,
                        help="sample/forward pairs for the demo model's floor ratio, after the rounds")
    parser.add_argument("--rss-samples", type=int, default=2000,
                        help="samples of the RSS run with a log_dir (0: skip it)")
    parser.add_argument("--rss-probe-images", type=int, default=64, help="probe images of the RSS run")
    parser.add_argument("--rss-every", type=int, default=100, help="samples between two RSS readings")
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
    begin = time.perf_counter()
    watch = Watch(watched_model, probe_x.to(args.device), probe_y.to(args.device), every_n_steps=args.every,
                  registry=CollectorRegistry(), run_name="bench", log_dir=log_dir.name)
    start_s = time.perf_counter() - begin
    print(f"device {args.device}, torch {torch.__version__}, {threads} threads, model {args.model}, "
          f"every_n_steps={args.every}, {args.probe_images} probe images")
    plain_times, watched_times, forward_times = [], [], []
    plain_steps: list[float] = []
    watched_steps: list[float] = []
    probe_on_device = probe_x.to(args.device)
    step = 1
    run(plain_model, opts[0], x, y, 5, 10_001, args.device, batch=batch)  # warm-up (no sampling step)
    run(watched_model, opts[1], x, y, 5, 10_001, args.device, batch=batch)
    arms = [(plain_model, opts[0], None, plain_times, plain_steps),
            (watched_model, opts[1], watch, watched_times, watched_steps)]
    for r in range(args.rounds):
        for model, optimizer, arm_watch, times, step_times in arms if r % 2 == 0 else arms[::-1]:
            times.append(run(model, optimizer, x, y, args.steps, step, args.device, arm_watch, batch, step_times))
        forward_times.append(measure_latency({"plain": plain_model}, probe_on_device, warmup=0,
                                             rounds=3)["plain"] / 1e3)
        step += args.steps
        print(f"round {r + 1}: plain {plain_times[-1]:.2f} s, watched {watched_times[-1]:.2f} s")
    samples = [s.duration_s for s in watch.history]
    charged = [s.overhead_s for s in watch.history if s.overhead_s is not None]
    ratios = [s.overhead_ratio for s in watch.history if s.overhead_ratio is not None]
    without_probes = Watch(watched_model, probe_on_device, probe_y.to(args.device), every_n_steps=args.every,
                           registry=CollectorRegistry(), run_name="without-probes", probe_every=10**9)
    without_probes.sample(step - 1)  # its first sample runs the probes; every later one skips them
    floor_pair = floor_pairs(watch, watched_model, probe_on_device, args.floor_pairs, step, without_probes)
    without_probes.close(final_sample=False)
    begin = time.perf_counter()
    watch.close()
    close_s = time.perf_counter() - begin
    log_dir.cleanup()
    slowdown = after_sample_slowdown(watched_steps, statistics.median(plain_steps), args.every, 1)
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
    floor_ratio = floor_pair["floor_ratio"]
    print(f"floor ratio ({args.model}): one sample / one plain forward of the probe batch = {floor_ratio:.2f} "
          f"({args.floor_pairs} interleaved pairs after the rounds: {1e3 * floor_pair['sample_s']:.0f} ms / "
          f"{1e3 * floor_pair['forward_s']:.0f} ms; without the linear probes "
          f"{floor_pair['floor_ratio_without_probes']:.2f}); the rounds' samples against the forwards after each round "
          f"{statistics.median(samples) / statistics.median(forward_times):.2f}, "
          f"with their exports {statistics.median(charged) / statistics.median(forward_times):.2f}")
    vit_small = vit_small_floor(args.vit_probe_images, args.vit_samples, args.device) if args.vit_probe_images \
        else None
    if vit_small:
        print(f"floor ratio (ViT-S/16, 224 px, {args.vit_probe_images} probe images): "
              f"{vit_small['floor_ratio']:.2f} ({1e3 * vit_small['sample_s']:.0f} ms / "
              f"{1e3 * vit_small['forward_s']:.0f} ms)")
    rss = rss_over_samples(args.rss_samples, args.rss_probe_images, args.device, threads, args.rss_every) \
        if args.rss_samples else None
    if rss:
        in_use = f", C heap in use {rss['in_use_growth_mb']:+.1f} MB" if rss["in_use_growth_mb"] is not None else ""
        print(f"RSS over {rss['samples']} samples with a log_dir: {rss['growth_mb']:+.1f} MB from sample "
              f"{rss['from_sample']} to the last{in_use}")
    whole_run_ratio = watched / plain - 1
    print(f"whole run: {100 * whole_run_ratio:+.2f} %; Watch start {start_s:.2f} s and close {close_s:.2f} s (outside "
          f"the rounds); steps after a sample {slowdown['after_sample']}, other steps {slowdown['other_steps']} "
          f"× the plain step")
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
                          "whole_run_ratio": whole_run_ratio,
                          "per_sample_pct": per_sample, "per_sample_ratio": per_sample / 100,
                          "per_sample_ratio_with_exports": statistics.median(charged) / (step_time * args.every),
                          "probe_forward_s": forward_times, "floor_pct": floor,
                          "log_dir": True, "floor_ratio": floor_ratio, "floor_pairs": floor_pair,
                          "rounds_floor_ratio": statistics.median(samples) / statistics.median(forward_times),
                          "floor_ratio_with_exports": statistics.median(charged) / statistics.median(forward_times),
                          "overhead_s": charged, "overhead_ratio_series": ratios,
                          "overhead_ratio_median": statistics.median(ratios) if ratios else None,
                          "watch_start_s": start_s, "watch_close_s": close_s, "step_ratio": slowdown,
                          "vit_small": vit_small, "rss": rss, "markdown": markdown})


if __name__ == "__main__":
    main()
