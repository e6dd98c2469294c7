"""Truncation of over-deep ViTs: ``truncate --strategy auto`` and the recommended depth against baselines.

For the deepest models of the depth sweep (``bench_depth.py``; default 24 blocks, both tasks, seeds 0–2),
read from the sweep's ``--work`` folder:

- ``auto``: :func:`isiwatch.truncation.truncate.auto_cut` with ``--max-drop`` 1 point and the
  default budget, choosing on
  the validation half of the held-out images;
- every fixed strategy (``recommended``: exactly the blocks :func:`isiwatch.measure.depth.recommend_depth` keeps;
  ``bi``, ``angular``, ``tail``, ``random``, and ``plateau`` where the curve has one) cut to the recommended
  depth K and healed with the library's budget;
- ``scratch``: a K-block ViT trained from scratch with the sweep's recipe for as many steps as make its
  training FLOPs equal to training the deep model plus one healing run (FLOPs of one forward + backward step
  from ``torch.utils.flop_counter``).

Every accuracy in the summary is on the test half of the held-out images, which no choice used. Latency is
measured separately (``--costs``: interleaved median of eval-mode forwards at batch 64 and 1) so that it can
run on an otherwise idle machine.

    python benchmarks/bench_truncate_auto.py                  # cuts and baselines (one process per task is fine)
    python benchmarks/bench_truncate_auto.py --costs --threads 2   # latency, alone on the machine; then summary
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_depth import BATCH, LR, PROBE_IMAGES, build_model, checkpoint_path, mean_ci  # noqa: E402
from bench_truncate import step_flops  # noqa: E402
from depth_tasks import TASKS, load_task  # noqa: E402
from machine import machine  # noqa: E402

from isiwatch._utils.files import write_json  # noqa: E402
from isiwatch._utils.threads import add_threads_argument, current_load, set_torch_threads  # noqa: E402
from isiwatch.measure.analysis import analyze  # noqa: E402
from isiwatch.measure.boundary_distances import boundary_distances  # noqa: E402
from isiwatch.measure.depth import recommend_depth  # noqa: E402
from isiwatch.truncation.cost import count_parameters, forward_flops, measure_latency  # noqa: E402
from isiwatch.truncation.healing import accuracy, default_train_last, heal, prepare_healing, train_classifier  # noqa: E402  # noqa: E402
from isiwatch.truncation.strategies import DEFAULT_BUDGET, DEFAULT_MAX_DROP  # noqa: E402
from isiwatch.truncation.truncate import HEAL_EPOCHS, auto_cut, choose_blocks, cut_vit  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "truncate_auto"
FIXED = ("recommended", "bi", "angular", "tail", "random", "plateau")
HEAL_BATCH = 128


def load_items(path: Path) -> dict[str, dict]:
    if not path.exists():
        return {}
    return {(r := json.loads(line))["key"]: r for line in path.read_text().splitlines()}


def add_item(path: Path, row: dict) -> dict:
    with open(path, "a") as fh:
        fh.write(json.dumps(row) + "\n")
    return row


def load_deep(task, depth: int, seed: int, epochs: int, work: Path):
    model, _ = build_model(task, depth, seed)
    saved = torch.load(checkpoint_path(work, task.name, depth, seed, epochs), weights_only=True)
    model.load_state_dict(saved["state_dict"])
    return model.eval()


def run_one(task, seed: int, args, items: Path) -> None:
    done = load_items(items)
    prefix = f"{task.name}/{args.depth}/{seed}"
    model = load_deep(task, args.depth, seed, args.epochs, args.work)
    analysis = analyze(model, task.train_x[:PROBE_IMAGES], task.train_y[:PROBE_IMAGES])
    recommendation = recommend_depth(analysis, args.max_drop / 100)
    phases = analysis.phases
    distances = boundary_distances(model, task.train_x[:512])
    keep = recommendation.depth
    uncut = {"uncut_test": accuracy(model, task.test_x, task.test_y),
             "uncut_val": accuracy(model, task.val_x, task.val_y)}
    heal_options = {"epochs": HEAL_EPOCHS, "seed": seed, "train_last": None, "teacher": None, "amp": False}
    if f"{prefix}/auto" not in done:
        start = time.perf_counter()
        cut, kept, search = auto_cut(model, task, recommendation, phases, distances, args.max_drop, args.budget, seed,
                                     heal_options)
        row = add_item(items, {"key": f"{prefix}/auto", "task": task.name, "seed": seed, "strategy": "auto", **uncut,
                               "keep": len(kept), "kept": kept, "test": accuracy(cut, task.test_x, task.test_y),
                               "winner": search["winner_strategy"], "candidates": search["candidates"],
                               "recommendation": recommendation.to_dict(), "seconds": time.perf_counter() - start})
        print(f"{prefix} auto: K={len(kept)} ({row['winner']}) test {row['test']:.3f} vs uncut {row['uncut_test']:.3f}",
              flush=True)
    for strategy in FIXED:
        key = f"{prefix}/{strategy}"
        if key in done or keep >= args.depth or (strategy == "plateau" and phases is None):
            continue
        if strategy == "recommended":
            kept = recommendation.kept_blocks
        else:
            kept = choose_blocks(strategy, args.depth, keep, phases=phases, distances=distances, seed=seed)
        cut = cut_vit(model, kept)
        steps = heal(cut, task.train_x, task.train_y, **heal_options)
        row = add_item(items, {"key": key, "task": task.name, "seed": seed, "strategy": strategy, **uncut,
                               "keep": keep, "kept": kept, "test": accuracy(cut, task.test_x, task.test_y),
                               "val": accuracy(cut, task.val_x, task.val_y), "heal_steps": steps})
        print(f"{prefix} {strategy} K={keep}: test {row['test']:.3f}", flush=True)
    if f"{prefix}/scratch" not in done and keep < args.depth:
        add_item(items, scratch(task, seed, keep, model, args, uncut, prefix))


def scratch(task, seed: int, keep: int, full, args, uncut: dict, prefix: str) -> dict:
    """A ``keep``-block ViT trained from scratch on the FLOPs of training the deep model plus healing a cut."""
    x, y = task.train_x[:BATCH], task.train_y[:BATCH]
    steps_per_epoch = math.ceil(len(task.train_x) / BATCH)
    full_step = step_flops(full.train(), x, y)
    full.eval()
    cut = cut_vit(full, list(range(keep)))
    prepare_healing(cut, default_train_last(keep))
    heal_flops = HEAL_EPOCHS * math.ceil(len(task.train_x) / HEAL_BATCH) * step_flops(cut, x[:HEAL_BATCH],
                                                                                     y[:HEAL_BATCH])
    budget = args.epochs * steps_per_epoch * full_step + heal_flops
    model, _ = build_model(task, keep, seed)
    small_step = step_flops(model.train(), x, y)
    budget_steps = round(budget / small_step)
    start = time.perf_counter()
    steps = train_classifier(model, task.train_x, task.train_y, epochs=math.ceil(budget_steps / steps_per_epoch),
                             batch_size=BATCH, lr=LR, seed=seed, max_steps=budget_steps)
    row = {"key": f"{prefix}/scratch", "task": task.name, "seed": seed, "strategy": "scratch", **uncut, "keep": keep,
           "steps": steps, "flops_ratio": steps * small_step / budget, "seconds": time.perf_counter() - start,
           "test": accuracy(model, task.test_x, task.test_y)}
    print(f"{prefix} scratch K={keep}: {steps} steps ({row['flops_ratio']:.2f}× budget) test {row['test']:.3f}",
          flush=True)
    return row


def costs(task_names: list[str], rows: list[dict], args) -> list[dict]:
    """Parameters, FLOPs per image and interleaved median latency per kept depth, per task."""
    out = []
    for name in task_names:
        task = load_task(name)
        depths = sorted({args.depth, *(r["keep"] for r in rows if r["task"] == name)})
        models = {d: build_model(task, d, 0)[0].eval() for d in depths}
        entry = {d: {"task": name, "blocks": d, "parameters": count_parameters(m),
                     "flops_per_image": forward_flops(m, task.test_x[:1])} for d, m in models.items()}
        for batch in (64, 1):
            latency = measure_latency({str(d): m for d, m in models.items()}, task.test_x[:batch], warmup=5,
                                      rounds=args.latency_rounds)
            for d in depths:
                entry[d][f"latency_ms_b{batch}"] = latency[str(d)]
        out += list(entry.values())
    return out


def summarise(rows: list[dict], cost_rows: list[dict], args) -> tuple[dict, list[str]]:
    summary, lines = {}, []
    for name in sorted({r["task"] for r in rows}):
        sel = [r for r in rows if r["task"] == name]
        by = {(r["seed"], r["strategy"]): r for r in sel}
        seeds = sorted({r["seed"] for r in sel})
        cost = {c["blocks"]: c for c in cost_rows if c["task"] == name}
        full = cost.get(args.depth)
        uncut = [by[(s, "auto")]["uncut_test"] for s in seeds if (s, "auto") in by]
        task = {"uncut": mean_ci(uncut), "methods": {}, "paired": {}}
        lines += [f"**{name}**, {args.depth}-block models, seeds {', '.join(map(str, seeds))}: uncut test accuracy "
                  f"{fmt(uncut)} %.", "",
                  "| method | kept blocks (per seed) | blocks removed | test accuracy (%) "
                  "| test − uncut (points, paired) | latency speed-up b64 |", "|---|---|---|---|---|---|"]
        for method in ("auto", *FIXED, "scratch"):
            group = [by[(s, method)] for s in seeds if (s, method) in by]
            if not group:
                continue
            keeps = [r["keep"] for r in group]
            diffs = [r["test"] - r["uncut_test"] for r in group]
            speedups = [full["latency_ms_b64"] / cost[k]["latency_ms_b64"] for k in keeps
                        if full and k in cost and "latency_ms_b64" in cost[k]]
            label = method + (f" (winners: {', '.join(r['winner'] for r in group)})" if method == "auto" else "")
            task["methods"][method] = {"keeps": keeps, "test": [r["test"] for r in group], "diff": mean_ci(diffs),
                                       "removed": 1 - statistics.fmean(keeps) / args.depth,
                                       "speedup_b64": statistics.fmean(speedups) if speedups else None}
            speed = f"{statistics.fmean(speedups):.2f}×" if speedups else "–"
            removed = 100 * task["methods"][method]["removed"]
            lines.append(f"| {label} | {', '.join(map(str, keeps))} | {removed:.0f} % | "
                         f"{fmt([r['test'] for r in group])} | {fmt(diffs, signed=True)} | {speed} |")
        for other in (*FIXED[1:], "scratch"):
            diffs = [by[(s, "recommended")]["test"] - by[(s, other)]["test"] for s in seeds
                     if (s, "recommended") in by and (s, other) in by]
            if diffs:
                task["paired"][f"recommended - {other}"] = mean_ci(diffs)
        lines += ["", "Paired, recommended cut minus each baseline at the same K (test points): " + "; ".join(
            f"{k.split(' - ')[1]} {fmt_ci(v)}" for k, v in task["paired"].items()), ""]
        summary[name] = task
    return summary, lines


def cost_lines(cost_rows: list[dict], threads: int, rounds: int) -> list[str]:
    """The cost table: parameters, FLOPs and latency at batch 64 and 1 per task and kept depth."""
    lines = ["| task | blocks | params | MFLOPs/img | latency ms b64 | latency ms b1 |", "|---|---|---|---|---|---|"]
    lines += [f"| {c['task']} | {c['blocks']} | {c['parameters']:,} | {c['flops_per_image'] / 1e6:.2f} | "
              f"{c['latency_ms_b64']:.2f} | {c['latency_ms_b1']:.3f} |" for c in cost_rows]
    return [*lines, "", f"(latency: torch threads {threads}, {rounds} interleaved rounds)"]


def fmt(values: list[float], signed: bool = False) -> str:
    return fmt_ci(mean_ci(values), signed)


def fmt_ci(mean_half: tuple, signed: bool = True) -> str:
    mean, half = mean_half
    text = f"{100 * mean:+.1f}" if signed else f"{100 * mean:.1f}"
    return text + (f" ± {100 * half:.1f}" if half is not None else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--depth", type=int, default=24, help="depth of the sweep models to cut")
    parser.add_argument("--epochs", type=int, default=12, help="the sweep's training epochs")
    parser.add_argument("--max-drop", type=float, default=DEFAULT_MAX_DROP)
    parser.add_argument("--budget", type=int, default=DEFAULT_BUDGET)
    parser.add_argument("--work", type=Path, default=Path("/tmp/isiwatch-bench-depth"))
    parser.add_argument("--results", type=Path, default=RESULTS)
    add_threads_argument(parser)
    parser.add_argument("--costs", action="store_true", help="measure latency and write the summary")
    parser.add_argument("--latency-rounds", type=int, default=30)
    args = parser.parse_args()
    threads = set_torch_threads(args.threads)
    items = args.work / "truncate_auto_items.jsonl"
    if not args.costs:
        for name in args.tasks:
            task = load_task(name)
            for seed in args.seeds:
                run_one(task, seed, args, items)
        return
    record = machine(threads)
    rows = [r for r in load_items(items).values() if r["task"] in args.tasks and r["seed"] in args.seeds]
    cost_rows = costs(args.tasks, rows, args)
    summary, lines = summarise(rows, cost_rows, args)
    lines += cost_lines(cost_rows, threads, args.latency_rounds)
    print("\n".join(lines))
    record["load_1min_end"] = round(current_load(), 2)
    write_json(args.results / "truncate_auto.json", {"summary": summary, "rows": rows, "costs": cost_rows,
                                                     "markdown": lines, "machine": record,
                                                     "args": {k: str(v) for k, v in vars(args).items()}})


if __name__ == "__main__":
    main()
