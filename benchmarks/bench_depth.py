"""Depth sweep: how deep does a ViT on the embedded digits need to be, and what do deeper models add?

Trains same-width timm ViTs (width 64, 4 heads, MLP ratio 4) at several depths and seeds with one recipe
(AdamW + one-cycle at lr 3e-3, weight decay 0.05, batch 128, equal epochs) on the two tasks of
``depth_tasks.py`` (``digits``; ``max_pair``: the larger of two side-by-side digits), and records for each
model its held-out accuracy, training time and steps, parameters and FLOPs (forward per image, and one
training step's forward + backward at batch 128, both counted by ``torch.utils.flop_counter``), and the
``isiwatch.analyze`` output on two probe sets (1,000 training images, and the held-out images) as
``analysis.json`` files, and the boundary distances between all block boundaries (cosine and angle,
``isiwatch.measure.boundary_distances``) on 512 training images, so that any depth rule can be re-scored later
without retraining (``benchmarks/score_depth_rules.py``).

"Needed depth" of a task: the smallest depth whose mean held-out accuracy is within 1 point of the best
depth's mean.

    python benchmarks/bench_depth.py                                  # the committed run (see RESULTS.md)
    python benchmarks/bench_depth.py --tasks digits --depths 2 4 --seeds 0 --epochs 1   # smoke run
    python benchmarks/bench_depth.py --summarize-only                 # tables/plots from finished items

Finished models are appended to ``--work``/items.jsonl (a rerun skips them); checkpoints stay in ``--work``
(``bench_truncate_auto.py`` reads the deep ones); analyses, ``sweep.json`` and ``depth.png`` go to ``--results``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_truncate import step_flops  # noqa: E402
from depth_tasks import TASKS, Task, load_task  # noqa: E402
from intervals import fmt_ci, mean_ci  # noqa: E402
from machine import machine  # noqa: E402

from isiwatch._utils.files import write_json  # noqa: E402
from isiwatch._utils.threads import add_threads_argument, current_load, set_torch_threads  # noqa: E402
from isiwatch.measure.analysis import analyze  # noqa: E402
from isiwatch.measure.boundary_distances import boundary_distances  # noqa: E402
from isiwatch.truncation.cost import count_parameters, forward_flops  # noqa: E402
from isiwatch.truncation.healing import accuracy, make_digits_vit, train_classifier  # noqa: E402

BATCH, LR = 128, 3e-3
PROBE_IMAGES = 1000
DISTANCE_IMAGES = 512  # boundary distances for the angular rules, as truncate computes them
RESULTS = Path(__file__).parent / "results" / "depth"


def build_model(task: Task, depth: int, seed: int):
    return make_digits_vit(seed, depth=depth, **task.model_kwargs)


def analysis_path(results: Path, task: str, depth: int, seed: int, probe: str) -> Path:
    return results / "analyses" / f"{task}_d{depth:02d}_s{seed}_{probe}.json"


def checkpoint_path(work: Path, task: str, depth: int, seed: int, epochs: int) -> Path:
    return work / f"{task}_d{depth:02d}_s{seed}_e{epochs}.pt"


def train_one(task: Task, depth: int, seed: int, epochs: int, work: Path, results: Path) -> dict:
    model, kwargs = build_model(task, depth, seed)
    start = time.perf_counter()
    steps = train_classifier(model, task.train_x, task.train_y, epochs=epochs, batch_size=BATCH, lr=LR, seed=seed)
    seconds = time.perf_counter() - start
    model.eval()
    torch.save({"arch": "vit_tiny_patch16_224", "model_kwargs": kwargs, "state_dict": model.state_dict()},
               checkpoint_path(work, task.name, depth, seed, epochs))
    held_x, held_y = task.held_out
    probes = {"train": (task.train_x[:PROBE_IMAGES], task.train_y[:PROBE_IMAGES]), "held_out": (held_x, held_y)}
    for probe, (x, y) in probes.items():
        result = analyze(model, x, y)
        result.model_info.update({"task": task.name, "seed": seed, "epochs": epochs, "probe_set": probe})
        write_json(analysis_path(results, task.name, depth, seed, probe), result.to_dict())
    distances = boundary_distances(model, task.train_x[:DISTANCE_IMAGES])
    write_json(analysis_path(results, task.name, depth, seed, "distances"),
               {"cosine": distances.cosine.tolist(), "angle": distances.angle.tolist(), "images": DISTANCE_IMAGES})
    return {"task": task.name, "depth": depth, "seed": seed, "epochs": epochs, "steps": steps,
            "train_seconds": seconds, "held_out_accuracy": accuracy(model, held_x, held_y),
            "val_accuracy": accuracy(model, task.val_x, task.val_y),
            "test_accuracy": accuracy(model, task.test_x, task.test_y),
            "parameters": count_parameters(model), "forward_flops_per_image": forward_flops(model, held_x[:1]),
            "train_step_flops": step_flops(model.train(), task.train_x[:BATCH], task.train_y[:BATCH])}


def read_items(path: Path) -> dict[tuple, dict]:
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return {(r["task"], r["depth"], r["seed"], r["epochs"]): r for r in rows}


def needed_depth(means: dict[int, float], tolerance: float = 0.01) -> int:
    """The smallest depth whose mean accuracy is within ``tolerance`` of the best depth's."""
    best = max(means.values())
    return min(d for d, m in means.items() if m >= best - tolerance)


def paired(rows: list[dict], depth: int, deepest: int) -> dict:
    """Held-out accuracy of ``depth`` minus ``deepest``, same seed: differences, mean and 95 % half-width."""
    by_seed = {(r["depth"], r["seed"]): r["held_out_accuracy"] for r in rows}
    diffs = [by_seed[(depth, s)] - by_seed[(deepest, s)] for (d, s) in by_seed
             if d == deepest and (depth, s) in by_seed]
    mean, half = mean_ci(diffs)
    return {"differences": diffs, "mean": mean, "ci95": half}


def summarise(rows: list[dict]) -> dict:
    tasks = {}
    for name in sorted({r["task"] for r in rows}):
        sel = [r for r in rows if r["task"] == name]
        depths = sorted({r["depth"] for r in sel})
        per_depth = []
        for d in depths:
            group = sorted((r for r in sel if r["depth"] == d), key=lambda r: r["seed"])
            acc, half = mean_ci([r["held_out_accuracy"] for r in group])
            per_depth.append({"depth": d, "seeds": [r["seed"] for r in group],
                              "accuracy": [r["held_out_accuracy"] for r in group], "mean": acc, "ci95": half,
                              "train_seconds": statistics.fmean(r["train_seconds"] for r in group),
                              "forward_mflops_per_image": group[0]["forward_flops_per_image"] / 1e6,
                              "train_gflops": group[0]["steps"] * group[0]["train_step_flops"] / 1e9,
                              "parameters": group[0]["parameters"]})
        means = {p["depth"]: p["mean"] for p in per_depth}
        best = max(means, key=means.get)
        deepest = depths[-1]
        needed = needed_depth(means)
        tasks[name] = {"per_depth": per_depth, "needed_depth": needed, "best_depth": best,
                       "paired_minus_deepest": {d: paired(sel, d, deepest) for d in sorted({needed, best} - {deepest})},
                       "monotonic": all(means[a] <= means[b] for a, b in zip(depths, depths[1:]))}
    return tasks


def markdown(tasks: dict) -> list[str]:
    lines = []
    for name, t in tasks.items():
        lines += [f"**{name}** — needed depth {t['needed_depth']} (best mean at depth {t['best_depth']}); "
                  f"accuracy {'rises monotonically' if t['monotonic'] else 'is not monotonic'} in depth.", "",
                  "| depth | seeds | held-out accuracy (%) | train s (mean) | train GFLOPs | MFLOPs/img | params |",
                  "|---|---|---|---|---|---|---|"]
        for p in t["per_depth"]:
            lines.append(f"| {p['depth']} | {len(p['seeds'])} | {fmt_ci((p['mean'], p['ci95']))} | "
                         f"{p['train_seconds']:.0f} | {p['train_gflops']:.0f} | {p['forward_mflops_per_image']:.2f} | "
                         f"{p['parameters']:,} |")
        deepest = t["per_depth"][-1]["depth"]
        lines.append("")
        for depth, b in t["paired_minus_deepest"].items():
            lines.append(f"Depth {depth} minus depth {deepest}, same seed: {fmt_ci((b['mean'], b['ci95']), True)} "
                         f"points over {len(b['differences'])} seeds "
                         f"({', '.join(f'{100 * d:+.1f}' for d in b['differences'])}).")
        lines.append("")
    return lines


def plot(tasks: dict, results: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(tasks)
    fig, axes = plt.subplots(2, len(names), figsize=(5.5 * len(names), 8), squeeze=False)
    for col, name in enumerate(names):
        t = tasks[name]
        ax = axes[0, col]
        d = [p["depth"] for p in t["per_depth"]]
        ax.errorbar(d, [100 * p["mean"] for p in t["per_depth"]],
                    yerr=[100 * (p["ci95"] or 0) for p in t["per_depth"]],
                    marker="o", capsize=3)
        ax.axvline(t["needed_depth"], color="grey", ls="--", label=f"needed depth {t['needed_depth']}")
        ax.set(xscale="log", xticks=d, xticklabels=d, xlabel="blocks", ylabel="held-out accuracy (%)",
               title=f"{name}: accuracy vs depth (mean ± 95 % CI)")
        ax.legend()
        ax = axes[1, col]
        for depth in d:
            path = analysis_path(results, name, depth, 0, "train")
            if depth >= 4 and path.exists():
                rows = json.loads(path.read_text())["layers"]
                ax.plot([r["index"] + 1 for r in rows], [r["probe_cls"] for r in rows], label=f"{depth}: probe_cls")
                ax.plot([r["index"] + 1 for r in rows], [r["token_similarity"] for r in rows], ls=":",
                        color=ax.lines[-1].get_color())
        ax.set(xlabel="block (output of)", ylabel="value",
               title=f"{name}, seed 0: [CLS] probe (solid), token similarity (dotted)")
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = results / "depth.png"
    fig.savefig(path, dpi=90)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--depths", type=int, nargs="+", default=[1, 2, 4, 8, 12, 16, 24])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--work", type=Path, default=Path("/tmp/isiwatch-bench-depth"))
    parser.add_argument("--results", type=Path, default=RESULTS)
    add_threads_argument(parser)  # pass 1 when running one process per task
    parser.add_argument("--summarize-only", action="store_true")
    args = parser.parse_args()
    record = machine(set_torch_threads(args.threads))
    args.work.mkdir(parents=True, exist_ok=True)
    items_path = args.work / "items.jsonl"
    start = time.perf_counter()
    if not args.summarize_only:
        for name in args.tasks:
            task = load_task(name)
            for seed in args.seeds:
                for depth in args.depths:
                    if (name, depth, seed, args.epochs) in read_items(items_path):
                        continue
                    row = train_one(task, depth, seed, args.epochs, args.work, args.results)
                    with open(items_path, "a") as fh:
                        fh.write(json.dumps(row) + "\n")
                    print(f"{name} depth {depth} seed {seed}: {100 * row['held_out_accuracy']:.1f} % "
                          f"({row['train_seconds']:.0f} s)", flush=True)
    rows = [r for k, r in read_items(items_path).items() if k[3] == args.epochs]
    tasks = summarise(rows)
    lines = markdown(tasks)
    record["load_1min_end"] = round(current_load(), 2)
    print("\n".join(lines))
    write_json(args.results / "sweep.json", {"tasks": tasks, "models": rows, "markdown": lines,
                                             "args": {k: str(v) for k, v in vars(args).items()},
                                             "recipe": {"batch": BATCH, "lr": LR, "width": 64, "heads": 4},
                                             "minutes_this_invocation": (time.perf_counter() - start) / 60,
                                             "machine": None if args.summarize_only else record})
    plot(tasks, args.results)


if __name__ == "__main__":
    main()
