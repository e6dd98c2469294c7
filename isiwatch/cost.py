"""What a model costs to run: parameters, FLOPs (``torch.utils.flop_counter``) and measured latency
(``torch.utils.benchmark``)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs (multiply-add = 2) of everything ``fn`` runs, forward and backward, as counted by
    ``FlopCounterMode`` (matmuls, convolutions and attention; element-wise ops are not counted)."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


@torch.no_grad()
def forward_flops(model: nn.Module, images: Tensor) -> int:
    """FLOPs of one eval-mode forward pass over ``images``. Parameters are counted with ``requires_grad`` off
    (restored after): FlopCounterMode's module tracker would otherwise hook the parameter views some models pass
    between modules (CaiT's [CLS]), which fails under ``no_grad``."""
    modes = [(m, m.training) for m in model.modules()]
    flags = [(p, p.requires_grad) for p in model.parameters()]
    model.eval().requires_grad_(False)
    try:
        return count_flops(lambda: model(images))
    finally:
        for m, mode in modes:
            m.training = mode
        for p, flag in flags:
            p.requires_grad_(flag)


@torch.no_grad()
def measure_latency(models: Mapping[str, nn.Module], images: Tensor, *, warmup: int = 3,
                    rounds: int = 20) -> dict[str, float]:
    """Median wall time in milliseconds of one eval-mode forward pass over ``images`` for each model, timed with
    ``torch.utils.benchmark.Timer`` (CUDA synchronised, the current torch thread count).

    The models are interleaved (every round times each once, in a rotating order) so that load from other
    processes, clock changes and cache effects fall on all of them alike; ``warmup`` untimed rounds first.
    """
    from torch.utils.benchmark import Timer  # imports torch's C++-extension tooling: only when timing

    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    names = list(models)
    modes = {name: m.training for name, m in models.items()}
    threads = torch.get_num_threads()
    timers = {name: Timer("model(x)", globals={"model": m, "x": images.to(next(m.parameters()).device)},
                          num_threads=threads, label=name) for name, m in models.items()}
    times: dict[str, list[float]] = {name: [] for name in names}
    try:
        for m in models.values():
            m.eval()
        for r in range(warmup + rounds):
            for k in range(len(names)):
                name = names[(r + k) % len(names)]
                seconds = timers[name].timeit(1).median
                if r >= warmup:
                    times[name].append(seconds * 1e3)
    finally:
        for name, m in models.items():
            m.train(modes[name])
    return {name: statistics.median(values) for name, values in times.items()}
