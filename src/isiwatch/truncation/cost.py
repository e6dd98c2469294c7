"""What a model costs to run: parameters, FLOPs (``torch.utils.flop_counter``) and measured latency."""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..measure.flops import count_flops
from .classifier_layout import block_list


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


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


def _seconds(model: nn.Module, x: Tensor) -> float:
    """Wall time of one forward, with the device synchronised before and after on CUDA."""
    if x.is_cuda:
        torch.cuda.synchronize(x.device)
    start = time.perf_counter()
    model(x)
    if x.is_cuda:
        torch.cuda.synchronize(x.device)
    return time.perf_counter() - start


def measure_latency(models: Mapping[str, nn.Module], images: Tensor, *, warmup: int = 3,
                    rounds: int = 20) -> dict[str, float]:
    """Median wall time in milliseconds of one eval-mode forward pass over ``images`` for each model
    (`latency_samples`)."""
    return {name: statistics.median(values)
            for name, values in latency_samples(models, images, warmup=warmup, rounds=rounds).items()}


def quartiles(values: list[float]) -> tuple[float, float]:
    """The first and third quartiles of a latency sample: the spread a difference must clear."""
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    return q[0], q[2]


def separated(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether two interquartile ranges (low, high) do not overlap: a latency difference beyond the noise."""
    return a[1] < b[0] or b[1] < a[0]


def differs(a: list[float], b: list[float]) -> bool:
    """Whether two latency samples differ by more than their noise: their interquartile ranges do not
    overlap (a difference within them is not shown as one)."""
    return separated(quartiles(a), quartiles(b))


def model_costs(models: Mapping[str, nn.Module], images: Tensor, *, rounds: int = 20) -> dict[str, dict[str, Any]]:
    """Each model's cost, measured once for a run so every table shows the same figures: ``blocks``,
    ``parameters``, ``flops_per_image`` (the primary figures: they do not vary between runs), and the wall time of
    a forward over ``images`` from ``rounds`` interleaved repeats (`latency_samples`): ``latency_ms`` (median) and
    ``latency_quartiles_ms`` (first and third quartiles, the spread a speed-up must clear)."""
    times = latency_samples(models, images, rounds=rounds)
    return {name: {"blocks": len(block_list(m)), "parameters": count_parameters(m),
                   "flops_per_image": forward_flops(m, images[:1]), "latency_ms": statistics.median(times[name]),
                   "latency_quartiles_ms": list(quartiles(times[name]))}
            for name, m in models.items()}


@torch.no_grad()
def latency_samples(models: Mapping[str, nn.Module], images: Tensor, *, warmup: int = 3,
                    rounds: int = 20) -> dict[str, list[float]]:
    """Wall times in milliseconds of ``rounds`` eval-mode forward passes over ``images`` for each model, at
    the current torch thread count (CUDA synchronised).

    The models are interleaved (every round times each once, in a rotating order) so that load from other
    processes, clock changes and cache effects fall on all of them alike; ``warmup`` untimed rounds first.
    Timed with ``time.perf_counter`` around single calls: ``torch.utils.benchmark.Timer`` adds nothing to one
    call and imports torch's C++-extension tooling, which prints a CUDA_HOME notice on machines without CUDA.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    names = list(models)
    modes = {name: m.training for name, m in models.items()}
    inputs = {name: images.to(next(m.parameters()).device) for name, m in models.items()}
    times: dict[str, list[float]] = {name: [] for name in names}
    try:
        for m in models.values():
            m.eval()
        for r in range(warmup + rounds):
            for k in range(len(names)):
                name = names[(r + k) % len(names)]
                seconds = _seconds(models[name], inputs[name])
                if r >= warmup:
                    times[name].append(seconds * 1e3)
    finally:
        for name, m in models.items():
            m.train(modes[name])
    return times
