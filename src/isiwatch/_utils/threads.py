"""Torch's intra-op thread count on a machine that may be shared.

Torch starts one OpenMP thread per core, and its threads spin-wait for each other between parallel regions:
when other processes hold those cores, every small kernel waits for a descheduled thread and a training step
gets 10–30× slower, not 2×. So the demo and the benchmarks use only the cores that are idle now: the usable
cores (CPU affinity) minus the 1-minute load average, rounded, at least one.
"""

from __future__ import annotations

import argparse
import math
import os


def choose_threads(cpus: int, load: float) -> int:
    """Threads for ``cpus`` usable cores when ``load`` runnable processes (1-minute load average) compete."""
    return max(1, min(cpus, math.floor(cpus - max(0.0, load) + 0.5)))


def usable_cpus() -> int:
    """Cores this process may run on (its CPU affinity where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def current_load() -> float:
    """The 1-minute load average; 0 where the OS does not report one."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def set_torch_threads(threads: int | None = None) -> int:
    """Set torch's intra-op threads and return the count: ``threads`` when given, else ``OMP_NUM_THREADS``
    when set, else `choose_threads` for this machine now."""
    import torch

    if threads is None:
        omp = os.environ.get("OMP_NUM_THREADS", "")
        threads = int(omp) if omp.isdigit() and int(omp) > 0 else choose_threads(usable_cpus(), current_load())
    torch.set_num_threads(threads)
    return threads


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    """``--threads N`` for a benchmark script; pass ``args.threads`` to `set_torch_threads`."""
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: the idle cores now, see isiwatch._utils.threads)")
