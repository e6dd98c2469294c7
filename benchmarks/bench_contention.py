"""Training under CPU contention: torch's thread count chosen by isiwatch's rule against one thread per core.

The demo ViT trains for ``--steps`` steps (batch 128) three times: alone with the rule's threads (the
baseline), then next to ``--busy`` processes that each keep one core busy, once with one torch thread per
core (torch's default) and once with :func:`isiwatch._utils.threads.choose_threads` for the load they create.
A machine shared with k busy processes can at best give training (cores − k) / cores of its cores, so
proportional degradation is a slowdown of about cores / (cores − k); OpenMP threads spin-waiting on
cores they do not get show up as a much larger one.

    python benchmarks/bench_contention.py [--steps 20] [--busy 1]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from machine import machine

from isiwatch._utils.threads import choose_threads, usable_cpus
from isiwatch.io.data import DIGITS_TRAIN, embedded_digits
from isiwatch.truncation.healing import make_digits_vit

RESULT = Path(__file__).parent / "results" / "contention" / "contention.json"


def burn(stop) -> None:
    """Keep one core busy until ``stop`` is set."""
    while not stop.is_set():
        sum(i * i for i in range(10_000))


def train_time(threads: int, steps: int) -> float:
    torch.set_num_threads(threads)
    model, _ = make_digits_vit(0)
    optimizer = torch.optim.AdamW(model.parameters(), 1e-3)
    x, y = embedded_digits()
    x, y = x[:DIGITS_TRAIN], y[:DIGITS_TRAIN]
    gen = torch.Generator().manual_seed(0)

    def step():
        idx = torch.randint(0, len(x), (128,), generator=gen)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(3):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--busy", type=int, default=1, help="competing processes, one core each")
    args = parser.parse_args()
    cores = usable_cpus()
    rule_idle = choose_threads(cores, os.getloadavg()[0])
    idle = train_time(rule_idle, args.steps)
    stop = mp.Event()
    burners = [mp.Process(target=burn, args=(stop,), daemon=True) for _ in range(args.busy)]
    for b in burners:
        b.start()
    try:
        time.sleep(2)
        per_core = train_time(cores, args.steps)
        rule_busy = choose_threads(cores, float(args.busy))  # the load the burners add, as the rule reads it
        with_rule = train_time(rule_busy, args.steps)
    finally:
        stop.set()
        for b in burners:
            b.join()
    result = {"steps": args.steps, "busy_processes": args.busy, "cores": cores,
              "idle": {"threads": rule_idle, "step_s": idle},
              "busy_one_thread_per_core": {"threads": cores, "step_s": per_core, "slowdown": per_core / idle},
              "busy_rule": {"threads": rule_busy, "step_s": with_rule, "slowdown": with_rule / idle},
              "proportional_slowdown": cores / max(cores - args.busy, 1), "machine": machine(rule_idle)}
    print(json.dumps(result, indent=1))
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
