"""GPU readiness check: every figure the Watch needs on a CUDA device, in one run of at most 8 minutes.

1. Watch overhead: ViT-B/16 at 224 px training in bf16 autocast (AdamW), a plain copy and two watched copies (the
   probe pass in float32, and with ``probe_dtype="bfloat16"``) run in alternating rounds; Watch otherwise with
   default options, every 100 steps, 256 probe images. Ratio of total times and the median sample's cost against
   100 training steps, per watched copy.
2. Host–device synchronisations per Watch sample, counted by ``torch.cuda.set_sync_debug_mode("warn")`` (one
   warning per synchronising call) over forced samples.
3. What one sample costs: a forced sample against a plain no-grad eval forward of the probe batch in the same
   precision (float32, and the bf16 probe pass against a bf16-autocast forward), the seconds of each profiler
   range of a sample (``isiwatch.sample``, ``.forward``, ``.metrics``, ``.probes``, ``.host``) and the extra peak
   memory of a sample and of the forward (bytes above what was allocated before; CUDA only).
4. ``isiwatch.analyze`` against one plain eval forward over the same images (fp32 both).
5. Truncation latency: 12 → 8 → 6 blocks (``tail`` cuts) at batch 1, 64 and 256, bf16 autocast.
6. Watch on a ``torch.compile``'d training model (inductor): samples taken and graphs compiled (1: no
   recompilation by the probe pass).
7. ``watch.step()`` called inside the bf16 autocast block, where many training loops call it: every sample taken,
   no ``monitor_error`` record (the probe pass runs with autocast off).

Prints one JSON line on stdout (progress on stderr). ``--smoke`` runs the same code paths on the CPU with a
tiny ViT in seconds (sync counting and peak memory need CUDA and report null with the reason; compile uses the
"eager" backend), so a test keeps the script from rotting.

    python benchmarks/gpu_check.py [--out benchmarks/results/gpu/gpu_check.json]
    python benchmarks/gpu_check.py --smoke
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import timm
import torch
import torch.nn.functional as F
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).parent))
from profile_ranges import range_seconds  # noqa: E402

import isiwatch  # noqa: E402
from isiwatch._utils.files import write_json  # noqa: E402
from isiwatch._utils.threads import add_threads_argument, set_torch_threads  # noqa: E402
from isiwatch.io.data import embedded_digits  # noqa: E402
from isiwatch.truncation.cost import measure_latency  # noqa: E402
from isiwatch.truncation.truncate import cut_vit  # noqa: E402


@dataclass(frozen=True)
class Plan:
    """Sizes of one check. ``model``: timm kwargs on top of ``vit_base_patch16_224``."""

    model: dict
    batch: int
    rounds: int
    round_steps: int
    every: int
    probe_images: int
    sync_samples: int
    cost_repeats: int
    analyze_images: int
    latency_batches: tuple[int, ...]
    latency_rounds: int
    compile_backend: str
    compile_steps: int


FULL = Plan(model={}, batch=128, rounds=3, round_steps=300, every=100, probe_images=256, sync_samples=3, cost_repeats=5,
            analyze_images=1024, latency_batches=(1, 64, 256), latency_rounds=20, compile_backend="inductor",
            compile_steps=60)
SMOKE = Plan(model={"img_size": 32, "patch_size": 8, "embed_dim": 32, "num_heads": 2}, batch=8, rounds=2,
             round_steps=6, every=3, probe_images=16, sync_samples=2, cost_repeats=2,
             analyze_images=32,
             latency_batches=(1, 4, 8), latency_rounds=3, compile_backend="eager", compile_steps=4)
DEPTHS = (12, 8, 6)


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def make_model(plan: Plan, device: str) -> nn.Module:
    torch.manual_seed(0)
    model = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=10, **plan.model)
    return model.to(device).train()


def digits(plan: Plan, count: int, device: str) -> tuple[Tensor, Tensor]:
    """``count`` embedded digits resized to the model's input, 3 channels, on ``device``."""
    images, labels = embedded_digits()
    reps = -(-count // len(images))
    images, labels = images.repeat(reps, 1, 1, 1)[:count], labels.repeat(reps)[:count]
    size = plan.model.get("img_size", 224)
    x = F.interpolate(images.to(device), size=size, mode="bilinear").expand(-1, 3, -1, -1).contiguous()
    return x, labels.to(device)


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def train(model: nn.Module, opt: torch.optim.Optimizer, x: Tensor, y: Tensor, steps: int, first: int, batch: int,
          device: str, watch: isiwatch.Watch | None = None) -> float:
    """Seconds for ``steps`` bf16-autocast AdamW steps (CUDA synchronised at both ends)."""
    gen = torch.Generator().manual_seed(first)
    synchronize(device)
    start = time.perf_counter()
    for step in range(first, first + steps):
        idx = torch.randint(0, len(x), (batch,), generator=gen).to(device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = F.cross_entropy(model(x[idx]).float(), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if watch is not None:
            watch.step(step, loss)
    synchronize(device)
    return time.perf_counter() - start


PROBE_DTYPES = {"watched": None, "watched_bf16_probe": "bfloat16"}


def watch_overhead(plan: Plan, device: str, x: Tensor, y: Tensor, px: Tensor, py: Tensor) -> dict:
    """A plain copy and one watched copy per `PROBE_DTYPES` entry in alternating rounds; each Watch samples every
    ``plan.every`` steps."""
    models = {name: make_model(plan, device) for name in ("plain", *PROBE_DTYPES)}
    opts = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, m in models.items()}
    watches = {name: isiwatch.Watch(models[name], px, py, every_n_steps=plan.every, probe_dtype=dtype)
               for name, dtype in PROBE_DTYPES.items()}
    for name, model in models.items():  # warm-up (kernels, allocator); the Watch starts at step 1
        train(model, opts[name], x, y, 3, 0, plan.batch, device)
    times: dict[str, list[float]] = {name: [] for name in models}
    step = 1
    for r in range(plan.rounds):
        for name, model in models.items():
            times[name].append(train(model, opts[name], x, y, plan.round_steps, step, plan.batch, device,
                                     watches.get(name)))
        step += plan.round_steps
        log(f"round {r + 1}: " + ", ".join(f"{name} {t[-1]:.2f} s" for name, t in times.items()))
    step_s = statistics.median(times["plain"]) / plan.round_steps
    out: dict = {"train_step_s": step_s, "round_s": times}
    for name, watch in watches.items():
        samples = [s.duration_s for s in watch.history]
        watch.close()
        sample_s = statistics.median(samples)
        out[name] = {"probe_dtype": PROBE_DTYPES[name], "ratio": sum(times[name]) / sum(times["plain"]),
                     "samples": len(samples), "sample_s": sample_s,
                     "sample_share_of_every_steps": sample_s / (step_s * plan.every)}
    return out


def sync_count(plan: Plan, device: str, px: Tensor, py: Tensor) -> dict:
    """Synchronising CUDA calls per forced Watch sample (``torch.cuda.set_sync_debug_mode`` warnings)."""
    if device != "cuda":
        return {"per_sample": None, "reason": "host-device synchronisation exists only on CUDA; not counted on "
                                              f"{device}"}
    model = make_model(plan, device)
    watch = isiwatch.Watch(model, px, py, every_n_steps=1)
    loss = torch.zeros((), device=device)
    watch.step(1, loss)  # first sample: lazy initialisation is not a per-sample cost
    counts = []
    for step in range(2, 2 + plan.sync_samples):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                watch.step(step, loss)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        counts.append(sum("synchroniz" in str(w.message) for w in caught))
    watch.close()
    return {"per_sample": statistics.median(counts), "counts": counts, "reason": None}


def timed(fn: Callable[[], object], device: str, repeats: int) -> float:
    """Median seconds of ``fn`` over ``repeats`` runs after one warm-up (CUDA synchronised)."""
    fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def extra_peak_bytes(fn: Callable[[], object], device: str) -> int | None:
    """Peak bytes allocated during ``fn`` above what was allocated before it (CUDA; None elsewhere)."""
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def sample_cost(plan: Plan, device: str, px: Tensor, py: Tensor) -> dict:
    """A forced sample against a plain no-grad eval forward of the probe batch, in float32 and with the bf16
    probe pass against a bf16-autocast forward: median seconds, profiler parts, extra peak memory."""
    model = make_model(plan, device).eval()
    steps = iter(range(1, 1_000_000))
    out: dict = {"probe_images": len(px), "peak_memory_reason": None if device == "cuda" else
                 f"peak memory is counted by the CUDA allocator; not measured on {device}"}
    for dtype in ("float32", "bfloat16"):
        watch = isiwatch.Watch(model, px, py, every_n_steps=1, probe_dtype=None if dtype == "float32" else dtype)

        def forward(dtype: str = dtype) -> None:
            with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
                model(px)

        def sample(watch: isiwatch.Watch = watch) -> None:
            watch.sample(next(steps))

        forward_s, sample_s = timed(forward, device, plan.cost_repeats), timed(sample, device, plan.cost_repeats)
        out[dtype] = {"forward_s": forward_s, "sample_s": sample_s, "ratio": sample_s / forward_s,
                      "parts_s": range_seconds(sample), "forward_extra_peak_bytes": extra_peak_bytes(forward, device),
                      "sample_extra_peak_bytes": extra_peak_bytes(sample, device)}
        watch.close(final_sample=False)
        log(f"sample cost {dtype}: forward {forward_s:.3f} s, sample {sample_s:.3f} s ({sample_s / forward_s:.2f}x)")
    return out


def analyze_vs_forward(plan: Plan, device: str, x: Tensor, y: Tensor) -> dict:
    model = make_model(plan, device).eval()

    @torch.no_grad()
    def forward() -> None:
        for i in range(0, len(x), 256):
            model(x[i:i + 256])

    t_plain = timed(forward, device, 3)
    t_analyze = timed(lambda: isiwatch.analyze(model, x, y, batch_size=256), device, 3)
    return {"images": len(x), "forward_s": t_plain, "analyze_s": t_analyze, "ratio": t_analyze / t_plain}


def truncate_latency(plan: Plan, device: str, x: Tensor) -> dict:
    """Milliseconds per eval forward of the 12-block model and its 8- and 6-block tail cuts, per batch size."""
    model = make_model(plan, device).eval()
    models = {str(k): model if k == DEPTHS[0] else cut_vit(model, list(range(k))) for k in DEPTHS}
    out = {}
    for batch in plan.latency_batches:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            ms = measure_latency(models, x[:batch], rounds=plan.latency_rounds)
        out[str(batch)] = {depth: round(v, 4) for depth, v in ms.items()}
    return out


def watch_compiled(plan: Plan, device: str, x: Tensor, y: Tensor, px: Tensor, py: Tensor) -> dict:
    """Train a compiled model with the Watch attached; one graph means the probe pass never recompiled it."""
    import torch._dynamo as dynamo
    from torch._dynamo.utils import counters

    dynamo.reset()
    counters.clear()
    model = make_model(plan, device)
    compiled = torch.compile(model, backend=plan.compile_backend)
    opt = torch.optim.AdamW(compiled.parameters(), lr=1e-4)
    every = max(1, plan.compile_steps // 4)
    watch = isiwatch.Watch(compiled, px, py, every_n_steps=every)
    seconds = train(compiled, opt, x, y, plan.compile_steps, 1, plan.batch, device, watch)
    samples = len(watch.history)
    watch.close()
    graphs = counters["stats"]["unique_graphs"]
    dynamo.reset()
    return {"backend": plan.compile_backend, "steps": plan.compile_steps, "every": every, "samples": samples,
            "unique_graphs": graphs, "seconds": seconds, "ok": samples == plan.compile_steps // every and graphs == 1}


def watch_in_autocast(plan: Plan, device: str, x: Tensor, y: Tensor, px: Tensor, py: Tensor) -> dict:
    """``step()`` inside ``torch.autocast`` (bf16, on the CPU too): samples taken and failures reported."""
    model = make_model(plan, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    steps = plan.compile_steps
    every = max(1, steps // 4)
    faults: list[str] = []
    watch = isiwatch.Watch(model, px, py, every_n_steps=every,
                           alert_callback=lambda a: faults.append(a.message) if a.kind == "monitor_error" else None)
    gen = torch.Generator().manual_seed(0)
    for step in range(1, steps + 1):
        idx = torch.randint(0, len(x), (plan.batch,), generator=gen).to(device)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x[idx]).float(), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            watch.step(step, loss)
    samples = len(watch.history)
    watch.close()
    return {"steps": steps, "every": every, "samples": samples, "monitor_errors": faults,
            "ok": samples == steps // every and not faults}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU, in seconds")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    add_threads_argument(parser)
    args = parser.parse_args()
    threads = set_torch_threads(args.threads)
    plan = SMOKE if args.smoke else FULL
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_check needs a CUDA device (or --smoke)")
    start = time.perf_counter()
    x, y = digits(plan, plan.batch * 16, device)
    px, py = digits(plan, plan.probe_images, device)
    sections: dict[str, Callable[[], dict]] = {
        "watch_overhead": lambda: watch_overhead(plan, device, x, y, px, py),
        "syncs_per_sample": lambda: sync_count(plan, device, px, py),
        "sample_cost": lambda: sample_cost(plan, device, px, py),
        "analyze_vs_forward": lambda: analyze_vs_forward(plan, device, *digits(plan, plan.analyze_images, device)),
        "truncate_latency_ms": lambda: truncate_latency(plan, device, x),
        "watch_compile": lambda: watch_compiled(plan, device, x, y, px, py),
        "watch_in_autocast": lambda: watch_in_autocast(plan, device, x, y, px, py),
    }
    result: dict = {"smoke": args.smoke, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                    "torch": torch.__version__, "threads": threads, "plan": asdict(plan), "section_s": {}}
    for name, run in sections.items():
        begin = time.perf_counter()
        result[name] = run()
        result["section_s"][name] = round(time.perf_counter() - begin, 2)
        log(f"{name}: {result['section_s'][name]} s")
    result["total_s"] = round(time.perf_counter() - start, 2)
    if args.out:
        write_json(args.out, result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
