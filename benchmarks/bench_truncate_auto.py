"""Truncation of over-deep ViTs: ``truncate --strategy auto`` and the recommended depth against baselines.

For the deepest models of the depth sweep (``bench_depth.py``; default 24 blocks, both tasks, seeds 0–2),
read from the sweep's ``--work`` folder:

- ``auto``: :func:`isiwatch.truncation.truncate.auto_cut` with ``--max-drop`` 1 point, ``--confidence`` 0 (the
  point estimate) and the default budget, choosing on the validation half of the held-out images;
- every fixed strategy (``recommended``: exactly the blocks :func:`isiwatch.measure.depth.recommend_depth` keeps;
  ``bi``, ``angular``, ``tail``, ``random``, and ``plateau`` where the curve has one) cut to the recommended
  depth K and healed with the library's budget;
- ``scratch``: a K-block ViT trained from scratch with the sweep's recipe for as many steps as make its
  training FLOPs equal to training the deep model plus one healing run (FLOPs of one forward + backward step
  from ``torch.utils.flop_counter``).

Every accuracy in the summary is on the test half of the held-out images, which no choice used. Latency is
measured separately (``--costs``: interleaved median of eval-mode forwards at batch 64 and 1) so that it can
run on an otherwise idle machine.

``--guarantee`` evaluates the acceptance rule instead: for each model and ``--resamples`` random re-splits of the
held-out images into validation and test halves, ``auto`` at ``--guarantee-max-drop`` (3 points: 500 validation
images cannot certify 1 point at all) with confidence 0.95 (plain healing and ``--distill``, at equal optimizer
steps) and with confidence 0 (the point estimate, plain), each scored once on its test half. The summary gives,
per variant, how often the test drop exceeded the max drop (the goal at 0.95: at most 5 % of cases), blocks
removed and latency speed-up, and the paired test accuracy of ``--distill`` minus plain.

    python benchmarks/bench_truncate_auto.py                  # cuts and baselines (one process per task is fine)
    python benchmarks/bench_truncate_auto.py --guarantee      # the rule: 2 tasks × 3 seeds × 2 resamples × 3
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
from bench_depth import BATCH, LR, PROBE_IMAGES, build_model, checkpoint_path  # noqa: E402
from bench_truncate import step_flops  # noqa: E402
from depth_tasks import TASKS, Task, load_task  # noqa: E402
from intervals import fmt_ci, mean_ci  # noqa: E402
from machine import machine  # noqa: E402

from isiwatch._utils.files import write_json  # noqa: E402
from isiwatch._utils.threads import add_threads_argument, current_load, set_torch_threads  # noqa: E402
from isiwatch.io.checkpoint import Checkpoint  # noqa: E402
from isiwatch.measure.analysis import DEFAULT_PHASE_METRIC, analyze  # noqa: E402
from isiwatch.measure.boundary_distances import boundary_distances  # noqa: E402
from isiwatch.measure.depth import recommend_depth  # noqa: E402
from isiwatch.truncation.auto_search import auto_cut  # noqa: E402
from isiwatch.truncation.confidence import PairedDrop  # noqa: E402
from isiwatch.truncation.cost import count_parameters, forward_flops, measure_latency  # noqa: E402
from isiwatch.truncation.healing import (  # noqa: E402
    HEAL_BATCH,
    accuracy,
    default_train_last,
    heal,
    predict,
    prepare_healing,
    train_classifier,
)
from isiwatch.truncation.plan import TruncationPlan  # noqa: E402
from isiwatch.truncation.request import TruncateRequest  # noqa: E402
from isiwatch.truncation.strategies import DEFAULT_BUDGET, DEFAULT_MAX_DROP, HEAL_EPOCHS, choose_blocks  # noqa: E402
from isiwatch.truncation.surgery import cut_vit  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "truncate_auto"
FIXED = ("recommended", "bi", "angular", "tail", "random", "plateau")


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


def auto_plan(model, split: Task, measured: tuple, seed: int, **options) -> TruncationPlan:
    """A truncate plan of an in-memory sweep model on ``split``; ``measured``: its recommendation, phases and
    boundary distances; ``options``: :class:`TruncateRequest` fields (max_drop, confidence, budget, ...)."""
    recommendation, phases, distances = measured
    request = TruncateRequest(model, seed=seed, **{"bridge": "none", **options})  # the rule as measured: no bridge
    source = Checkpoint(Path("<sweep model>"), "vit", {}, {}, "")
    return TruncationPlan(request=request, checkpoint=source, uncut=model, split=split, normalization=None,
                          fabric=request.fabric_options.launch(), metric=DEFAULT_PHASE_METRIC, phases=phases,
                          recommendation=recommendation, distances=distances, kept=None)


def measure_model(model, task, max_drop: float) -> tuple:
    """What auto reads about the uncut model, measured on its healing images."""
    analysis = analyze(model, task.train_x[:PROBE_IMAGES], task.train_y[:PROBE_IMAGES])
    return (recommend_depth(analysis, max_drop / 100), analysis.phases, boundary_distances(model, task.train_x[:512]))


def run_one(task, seed: int, args, items: Path) -> None:
    done = load_items(items)
    prefix = f"{task.name}/{args.depth}/{seed}"
    model = load_deep(task, args.depth, seed, args.epochs, args.work)
    measured = measure_model(model, task, args.max_drop)
    recommendation, phases, distances = measured
    keep = recommendation.depth
    uncut = {"uncut_test": accuracy(model, task.test_x, task.test_y),
             "uncut_val": accuracy(model, task.val_x, task.val_y)}
    heal_options = {"epochs": HEAL_EPOCHS, "seed": seed, "train_last": None, "teacher": None, "amp": False}
    if f"{prefix}/auto" not in done:
        start = time.perf_counter()
        found = auto_cut(auto_plan(model, task, measured, seed, max_drop=args.max_drop, confidence=0.0,
                                   budget=args.budget, epochs=HEAL_EPOCHS))
        kept, search = found.kept, found.record
        row = add_item(items, {"key": f"{prefix}/auto", "task": task.name, "seed": seed, "strategy": "auto", **uncut,
                               "keep": len(kept), "kept": kept, "test": accuracy(found.model, task.test_x, task.test_y),
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


#: Guarantee variants: confidence and healing (distillation or plain), at equal optimizer steps.
VARIANTS = {"plain 0.95": (0.95, False), "distill 0.95": (0.95, True), "plain 0 (point estimate)": (0.0, False)}


def resampled(task: Task, seed: int, resample: int) -> Task:
    """The task with its held-out images shuffled (seeded by model seed and resample) and halved again into
    validation and test."""
    held_x, held_y = torch.cat([task.val_x, task.test_x]), torch.cat([task.val_y, task.test_y])
    order = torch.randperm(len(held_y), generator=torch.Generator().manual_seed(1000 * seed + resample))
    val, test = order[:len(order) // 2], order[len(order) // 2:]
    return Task(task.train_x, task.train_y, held_x[val], held_y[val], held_x[test], held_y[test], task.name,
                task.model_kwargs)


def guarantee_one(task, seed: int, args, items: Path) -> None:
    """Every variant of ``auto`` on every resampled split of one sweep model; one row each."""
    done = load_items(items)
    model = load_deep(task, args.depth, seed, args.epochs, args.work)
    measured = measure_model(model, task, args.guarantee_max_drop)
    steps = HEAL_EPOCHS * math.ceil(len(task.train_y) / HEAL_BATCH)  # equal steps for distill and plain
    for resample in range(args.resamples):
        split = resampled(task, seed, resample)
        uncut_correct = predict(model, split.test_x) == split.test_y
        for variant, (confidence, distill) in VARIANTS.items():
            key = f"{task.name}/{args.depth}/{seed}/guarantee/{resample}/{variant}"
            if key in done:
                continue
            start = time.perf_counter()
            found = auto_cut(auto_plan(model, split, measured, seed, max_drop=args.guarantee_max_drop,
                                       confidence=confidence, budget=args.budget, heal_steps=steps, distill=distill))
            kept, search = found.kept, found.record
            cut_correct = predict(found.model, split.test_x) == split.test_y
            drop = PairedDrop.from_correct(uncut_correct.tolist(), cut_correct.tolist())
            row = add_item(items, {"key": key, "task": task.name, "seed": seed, "strategy": "guarantee",
                                   "resample": resample, "variant": variant, "confidence": confidence,
                                   "distill": distill, "max_drop": args.guarantee_max_drop, "keep": len(kept),
                                   "test_drop_points": 100 * drop.drop, "test": float(cut_correct.float().mean()),
                                   "exceeded": 100 * drop.drop > args.guarantee_max_drop,
                                   "candidates": len(search["candidates"]), "heal_steps": steps,
                                   "seconds": time.perf_counter() - start})
            print(f"{key}: K={row['keep']} test drop {row['test_drop_points']:+.2f} points"
                  f"{' EXCEEDED' if row['exceeded'] else ''}", flush=True)


def guarantee_summary(rows: list[dict], cost_rows: list[dict], args) -> tuple[dict, list[str]]:
    """Per variant: cases, how often the test drop exceeded the max drop, blocks removed, speed-up; and the
    paired test accuracy of distillation minus plain healing at confidence 0.95."""
    if not any(r.get("variant") for r in rows):
        return {}, []
    cost = {(c["task"], c["blocks"]): c for c in cost_rows}
    summary: dict = {"variants": {}}
    lines = [f"**The acceptance rule** (`--guarantee`): {args.depth}-block sweep models, max drop "
             f"{args.guarantee_max_drop:g} points, every model × resampled validation/test split.", "",
             "| variant | cases | test drop > max drop | cuts | blocks removed | latency speed-up b64 | "
             "test drop (points) | worst test drop | search seconds (median) |", "|---" * 9 + "|"]
    for variant in VARIANTS:
        group = [r for r in rows if r.get("variant") == variant]
        if not group:
            continue
        speedups = [cost[(r["task"], args.depth)]["latency_ms_b64"] / cost[(r["task"], r["keep"])]["latency_ms_b64"]
                    for r in group if (r["task"], r["keep"]) in cost and (r["task"], args.depth) in cost]
        entry = {"cases": len(group), "exceeded_rate": statistics.fmean(r["exceeded"] for r in group),
                 "cut_rate": statistics.fmean(r["keep"] < args.depth for r in group),
                 "removed": 1 - statistics.fmean(r["keep"] for r in group) / args.depth,
                 "speedup_b64": statistics.fmean(speedups) if speedups else None,
                 "test_drop": mean_ci([r["test_drop_points"] / 100 for r in group]),
                 "worst_test_drop_points": max(r["test_drop_points"] for r in group),
                 "cuts": sum(r["keep"] < args.depth for r in group),
                 "search_seconds_median": statistics.median(r["seconds"] for r in group)}
        summary["variants"][variant] = entry
        speed = f"{entry['speedup_b64']:.2f}×" if entry["speedup_b64"] else "–"
        lines.append(f"| {variant} | {entry['cases']} | {100 * entry['exceeded_rate']:.1f} % | "
                     f"{100 * entry['cut_rate']:.0f} % | {100 * entry['removed']:.0f} % | {speed} | "
                     f"{fmt_ci(entry['test_drop'], signed=True)} | {entry['worst_test_drop_points']:+.1f} | "
                     f"{entry['search_seconds_median']:.0f} |")
    pairs = {(r["task"], r["seed"], r["resample"]): r for r in rows if r.get("variant") == "plain 0.95"}
    diffs = [r["test"] - pairs[k]["test"] for r in rows if r.get("variant") == "distill 0.95"
             and (k := (r["task"], r["seed"], r["resample"])) in pairs]
    if diffs:
        summary["distill_minus_plain"] = mean_ci(diffs)
        plain, distill = summary["variants"]["plain 0.95"], summary["variants"]["distill 0.95"]
        summary["distill_search_time_ratio"] = distill["search_seconds_median"] / plain["search_seconds_median"]
        lines += ["", f"`--distill` minus plain healing at equal steps, paired test accuracy: "
                  f"{fmt_ci(summary['distill_minus_plain'], signed=True)} points over {len(diffs)} cases; "
                  "certified cuts "
                  f"{distill['cuts']} against {plain['cuts']}; median search time "
                  f"{summary['distill_search_time_ratio']:.1f}× plain's.", ""]
    return summary, lines


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
            f"{k.split(' - ')[1]} {fmt_ci(v, signed=True)}" for k, v in task["paired"].items()), ""]
        summary[name] = task
    return summary, lines


def cost_lines(cost_rows: list[dict], threads: int, rounds: int) -> list[str]:
    """The cost table: parameters, FLOPs and latency at batch 64 and 1 per task and kept depth."""
    lines = ["| task | blocks | params | MFLOPs/img | latency ms b64 | latency ms b1 |", "|---|---|---|---|---|---|"]
    lines += [f"| {c['task']} | {c['blocks']} | {c['parameters']:,} | {c['flops_per_image'] / 1e6:.2f} | "
              f"{c['latency_ms_b64']:.2f} | {c['latency_ms_b1']:.3f} |" for c in cost_rows]
    return [*lines, "", f"(latency: torch threads {threads}, {rounds} interleaved rounds)"]


def fmt(values: list[float], signed: bool = False) -> str:
    """Mean ± half-width in points; the mean is scaled after averaging, as the committed tables were written."""
    return fmt_ci(mean_ci(values), signed)


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
    parser.add_argument("--guarantee", action="store_true",
                        help="evaluate the acceptance rule on resampled validation/test splits")
    parser.add_argument("--resamples", type=int, default=2, help="--guarantee: re-splits per model")
    parser.add_argument("--guarantee-max-drop", type=float, default=3.0, help="--guarantee: max drop (points)")
    parser.add_argument("--costs", action="store_true", help="measure latency and write the summary")
    parser.add_argument("--latency-rounds", type=int, default=30)
    args = parser.parse_args()
    threads = set_torch_threads(args.threads)
    items = args.work / "truncate_auto_items.jsonl"
    if not args.costs:
        for name in args.tasks:
            task = load_task(name)
            for seed in args.seeds:
                (guarantee_one if args.guarantee else run_one)(task, seed, args, items)
        return
    record = machine(threads)
    every = [r for r in load_items(items).values() if r["task"] in args.tasks and r["seed"] in args.seeds]
    rows = [r for r in every if r["strategy"] != "guarantee"]
    cost_rows = costs(args.tasks, every, args)
    summary, lines = summarise(rows, cost_rows, args)
    guarantee, guarantee_lines = guarantee_summary(every, cost_rows, args)
    lines += guarantee_lines + cost_lines(cost_rows, threads, args.latency_rounds)
    print("\n".join(lines))
    record["load_1min_end"] = round(current_load(), 2)
    write_json(args.results / "truncate_auto.json", {"summary": summary, "rows": rows, "costs": cost_rows,
                                                     "guarantee": {"summary": guarantee, "markdown": guarantee_lines,
                                                                   "rows": [r for r in every if r not in rows]},
                                                     "markdown": lines, "machine": record,
                                                     "args": {k: str(v) for k, v in vars(args).items()}})


if __name__ == "__main__":
    main()
