"""Truncate evaluation: which blocks to cut from a ViT trained on the embedded digits, and is it worth it?

For each seed: train the demo ViT (12 blocks, width 64, 4 heads, patch 7) on the 4,000 training digits,
analyse it on 1,000 of them, then for each kept depth K (the plateau cut's own depth "auto", and fixed K)
cut it with every strategy (plateau, tail, ShortGPT block influence, Gromov angular distance, random) and
heal each cut with the same budget (the library defaults: the late half of the kept blocks, norm and
head; HEAL_EPOCHS epochs of AdamW + cosine at HEAL_LR, batch 128). Baseline: a K-block ViT trained from
scratch with the same total compute, i.e. for as many steps as make its training FLOPs equal to the FLOPs
of training the full model plus healing the cut (FLOPs of one forward + backward step, each counted
with torch.utils.flop_counter; optimizer updates are element-wise and not counted). Accuracy is on the
1,000 held-out digits.

    python benchmarks/bench_truncate.py                      # main table: results/truncate/truncate.json
    python benchmarks/bench_truncate.py --epochs 8 --out benchmarks/results/truncate/truncate_e8.json
    python benchmarks/bench_truncate.py --seeds 0 --epochs 2 --keeps 4 --scratch-keeps   # smoke run

Results are appended per item to ``--work``/items.jsonl (a rerun skips finished items) and summarised
to ``--out`` (JSON, with the machine and its load) and stdout (markdown tables); ``benchmarks/report.py``
renders RESULTS.md's section from the JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch
from intervals import fmt
from machine import machine

from isiwatch._utils.threads import add_threads_argument, current_load, set_torch_threads
from isiwatch.io.data import DIGITS_TRAIN, embedded_digits
from isiwatch.measure.analysis import analyze
from isiwatch.measure.boundary_distances import boundary_distances
from isiwatch.measure.phases import Phases
from isiwatch.truncation.cost import count_parameters, forward_flops, measure_latency
from isiwatch.truncation.healing import (
    HEAL_BATCH,
    accuracy,
    default_train_last,
    heal,
    make_digits_vit,
    predict,
    prepare_healing,
    train_classifier,
)
from isiwatch.truncation.strategies import HEAL_EPOCHS, HEAL_LR, STRATEGIES, CutInputs, choose_blocks
from isiwatch.truncation.surgery import cut_vit
from isiwatch.watch.freezing import step_flops as training_step_flops


def plateau_keep(phases: Phases) -> int:
    """The plateau strategy's default depth for the 12-block base model (the registry's rule)."""
    rule = STRATEGIES["plateau"].default_keep
    assert rule is not None
    return rule(12, CutInputs(phases=phases))


BASE_BATCH = 256  # pre-training and scratch batch (fewer, larger steps: per-step overhead dominates on CPU)
BASE_LR = 3e-3
PHASE_METRICS = ("token_similarity", "probe_cls", "probe_patch_mean", "attn_token_change", "isi")


def step_flops(model, x, y) -> int:
    """FLOPs of one training step's forward and backward with the model's current requires_grad flags: the
    library's count (`isiwatch.watch.freezing.step_flops`). The loss is element-wise, which the counter does not
    count, so the labels ``y`` change nothing (the signature is ``bench_depth.py``'s calls')."""
    return training_step_flops(model, x)


class Items:
    """Finished results, one JSON object a line, keyed so that a rerun skips them."""

    def __init__(self, path: Path):
        self.path = path
        self.done = {}
        if path.exists():
            for line in path.read_text().splitlines():
                row = json.loads(line)
                self.done[row["key"]] = row

    def add(self, row: dict) -> dict:
        with open(self.path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        self.done[row["key"]] = row
        return row


def base_model(seed: int, epochs: int, data, work: Path, items: Items):
    train_x, train_y, test_x, test_y = data
    model, kwargs = make_digits_vit(seed)
    path = work / f"base_seed{seed}_e{epochs}.pt"
    key = f"base/{seed}/{epochs}"
    if path.exists() and key in items.done:
        model.load_state_dict(torch.load(path, weights_only=True))
        return model.eval(), items.done[key]
    start = time.perf_counter()
    steps = train_classifier(model, train_x, train_y, epochs=epochs, batch_size=BASE_BATCH, lr=BASE_LR, seed=seed)
    seconds = time.perf_counter() - start
    torch.save(model.state_dict(), path)
    model.eval()
    analysis = analyze(model, train_x[:1000], train_y[:1000])
    phases = {m: (p.to_dict() if (p := analysis.detect_phases(m)) else None) for m in PHASE_METRICS}
    row = {"key": key, "seed": seed, "steps": steps, "seconds": seconds,
           "accuracy": accuracy(model, test_x, test_y), "phases": phases,
           "token_similarity": analysis.layers["token_similarity"], "probe_cls": analysis.layers["probe_cls"]}
    print(f"seed {seed}: base {row['accuracy']:.3f} after {steps} steps ({seconds:.0f} s); "
          f"plateau {phases['token_similarity']}", flush=True)
    return model, items.add(row)


def run_seed(seed: int, args, data, work: Path, items: Items) -> None:
    train_x, train_y, test_x, test_y = data
    model, base = base_model(seed, args.epochs, data, work, items)
    reference = predict(model, test_x)
    found = base["phases"]["token_similarity"]
    phases = Phases(*(tuple(found[k]) if found[k] else None for k in ("plateau", "cliff", "climb"))) if found else None
    keeps = sorted({*args.keeps, *([plateau_keep(phases)] if phases else [])})
    distances = boundary_distances(model, train_x[:512])
    for keep in keeps:
        for strategy in STRATEGIES:
            key = f"heal/{seed}/{keep}/{strategy}/{args.epochs}"
            if key in items.done or (strategy == "plateau" and phases is None):
                continue
            kept = choose_blocks(strategy, 12, keep, phases=phases, distances=distances, seed=seed)
            cut = cut_vit(model, kept)
            before = predict(cut, test_x)
            start = time.perf_counter()
            steps = heal(cut, train_x, train_y, train_last=default_train_last(keep), seed=seed)
            after = predict(cut, test_x)
            row = items.add({"key": key, "seed": seed, "keep": keep, "strategy": strategy, "kept": kept,
                             "auto": phases is not None and keep == plateau_keep(phases),
                             "cut": float((before == test_y).float().mean()),
                             "healed": float((after == test_y).float().mean()),
                             "agreement": float((after == reference).float().mean()),
                             "heal_steps": steps, "heal_seconds": time.perf_counter() - start})
            print(f"seed {seed} K={keep} {strategy:8s} kept {kept}: cut {row['cut']:.3f} → healed "
                  f"{row['healed']:.3f}", flush=True)
    for keep in sorted({plateau_keep(phases) if k == "auto" else int(k) for k in args.scratch_keeps
                        if k != "auto" or phases}):
        key = f"scratch/{seed}/{keep}/{args.epochs}"
        if key not in items.done:
            scratch(seed, keep, base, model, args, data, items, key, auto=phases is not None
                    and keep == plateau_keep(phases))


def scratch(seed: int, keep: int, base: dict, full, args, data, items: Items, key: str, auto: bool) -> None:
    """A ``keep``-block ViT trained from scratch on the FLOPs of full training + healing."""
    train_x, train_y, test_x, test_y = data
    xb, yb = train_x[:BASE_BATCH], train_y[:BASE_BATCH]
    full_step = step_flops(full.train(), xb, yb)
    full.eval()
    cut = cut_vit(full, list(range(keep)))
    prepare_healing(cut, default_train_last(keep))
    heal_step = step_flops(cut, xb[:HEAL_BATCH], yb[:HEAL_BATCH])
    heal_steps = HEAL_EPOCHS * math.ceil(len(train_x) / HEAL_BATCH)
    budget = base["steps"] * full_step + heal_steps * heal_step
    model, _ = make_digits_vit(seed, depth=keep)
    small_step = step_flops(model.train(), xb, yb)
    budget_steps = round(budget / small_step)
    epochs = math.ceil(budget_steps / math.ceil(len(train_x) / BASE_BATCH))
    start = time.perf_counter()
    steps = train_classifier(model, train_x, train_y, epochs=epochs, batch_size=BASE_BATCH, lr=BASE_LR, seed=seed,
                             max_steps=budget_steps)
    row = items.add({"key": key, "seed": seed, "keep": keep, "auto": auto, "strategy": "scratch", "epochs": epochs,
                     "steps": steps, "healed": accuracy(model, test_x, test_y),
                     "flops_ratio": steps * small_step / budget, "budget_flops": budget,
                     "seconds": time.perf_counter() - start})
    print(f"seed {seed} K={keep} scratch {steps} steps ({row['flops_ratio']:.2f}× budget): "
          f"{row['healed']:.3f}", flush=True)


def costs(keeps: list[int], test_x) -> list[dict]:
    """Parameters, FLOPs per image and interleaved median latency (batch 64 and 1) per depth."""
    models = {k: make_digits_vit(0, depth=k)[0].eval() for k in [12, *keeps]}
    rows = [{"blocks": k, "parameters": count_parameters(m), "flops_per_image": forward_flops(m, test_x[:1])}
            for k, m in models.items()]
    for batch in (64, 1):
        latency = measure_latency({str(k): m for k, m in models.items()}, test_x[:batch], warmup=5, rounds=30)
        for row in rows:
            row[f"latency_ms_b{batch}"] = latency[str(row["blocks"])]
    return rows


def cost_lines(cost_rows: list[dict]) -> list[str]:
    """The cost table: parameters, FLOPs per image and latency at batch 64 and 1 per depth."""
    return ["| blocks | params | MFLOPs/img | latency ms, batch 64 | latency ms, batch 1 |", "|---|---|---|---|---|",
            *(f"| {r['blocks']} | {r['parameters']:,} | {r['flops_per_image'] / 1e6:.2f} | "
              f"{r['latency_ms_b64']:.1f} | {r['latency_ms_b1']:.2f} |" for r in cost_rows)]


def summarise(items: Items, args) -> dict:
    rows = [r for r in items.done.values() if r["seed"] in args.seeds and r["key"].endswith(f"/{args.epochs}")]
    bases, heals, scratches = ([r for r in rows if r["key"].startswith(k)] for k in ("base/", "heal/", "scratch/"))
    lines = [f"Base models: {fmt([b['accuracy'] for b in bases])} % held-out accuracy "
             f"(seeds {', '.join(str(b['seed']) for b in bases)}; mean ± 95 % t-interval)."]
    for b in bases:
        lines.append(f"- seed {b['seed']}: {100 * b['accuracy']:.1f} %, token_similarity plateau "
                     f"{b['phases']['token_similarity']}")
    groups = [("auto", [r for r in heals if r["auto"]])] + [(str(k), [r for r in heals if r["keep"] == k])
                                                            for k in args.keeps]
    header = "| kept K | strategy | seeds | cut, no healing (%) | healed (%) | agreement with uncut (%) |"
    lines += ["", header, "|---|---|---|---|---|---|"]
    for label, group in groups:
        for strategy in STRATEGIES:
            sel = [r for r in group if r["strategy"] == strategy]
            if sel:
                ks = sorted({r["keep"] for r in sel})
                lines.append(f"| {label if label != 'auto' else 'plateau depth ' + '/'.join(map(str, ks))} | "
                             f"{strategy} | {len(sel)} | {fmt([r['cut'] for r in sel])} | "
                             f"{fmt([r['healed'] for r in sel])} | {fmt([r['agreement'] for r in sel])} |")
        sel = [r for r in scratches if (r["auto"] if label == "auto" else r["keep"] == int(label))]
        if sel:
            ratio = statistics.fmean(r["flops_ratio"] for r in sel)
            lines.append(f"| {label} | scratch (same FLOPs, {ratio:.2f}×) | {len(sel)} | – | "
                         f"{fmt([r['healed'] for r in sel])} | – |")
    paired = {}
    for reference in ("plateau", "tail"):
        diffs = paired_differences(heals + scratches, reference)
        paired[reference] = diffs
        lines += ["", f"Paired differences, {reference} minus each other strategy (healed accuracy, points, same "
                      "seed and K; mean ± 95 % t-interval):"]
        lines += [f"- vs {s}: {fmt(d)} over {len(d)} pairs" for s, d in diffs.items() if d]
    return {"lines": lines, "bases": bases, "heals": heals, "scratch": scratches, "paired": paired}


def paired_differences(rows: list[dict], reference: str) -> dict[str, list[float]]:
    """For every other strategy: ``reference``'s healed accuracy minus its own, over (seed, K) they share."""
    by = {(r["seed"], r["keep"], r["strategy"]): r["healed"] for r in rows}
    return {strategy: [by[(s, k, reference)] - v for (s, k, st), v in by.items()
                       if st == strategy and (s, k, reference) in by]
            for strategy in (*STRATEGIES, "scratch") if strategy != reference}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=20, help="pre-training epochs of the 12-block model")
    parser.add_argument("--keeps", type=int, nargs="*", default=[4], help="kept depths besides the plateau's")
    parser.add_argument("--scratch-keeps", nargs="*", default=["auto"],
                        help="depths of the from-scratch baseline ('auto': the plateau cut's depth)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/isiwatch-bench-truncate"))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "truncate" / "truncate.json")
    add_threads_argument(parser)
    args = parser.parse_args()
    threads = set_torch_threads(args.threads)
    record = machine(threads)
    args.work.mkdir(parents=True, exist_ok=True)
    images, labels = embedded_digits()
    data = images[:DIGITS_TRAIN], labels[:DIGITS_TRAIN], images[DIGITS_TRAIN:], labels[DIGITS_TRAIN:]
    items = Items(args.work / "items.jsonl")
    start = time.perf_counter()
    for seed in args.seeds:
        run_seed(seed, args, data, args.work, items)
    keeps = sorted({r["keep"] for r in items.done.values() if r["key"].startswith("heal/")})
    cost_rows = costs(keeps, data[2])
    summary = summarise(items, args)
    lines = summary.pop("lines")
    lines += ["", *cost_lines(cost_rows)]
    minutes = (time.perf_counter() - start) / 60
    lines.append(f"\n(run: {minutes:.1f} min this invocation, torch threads {threads}, "
                 f"heal {HEAL_EPOCHS} epochs at lr {HEAL_LR}, base {args.epochs} epochs batch {BASE_BATCH})")
    print("\n".join(lines))
    record["load_1min_end"] = round(current_load(), 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**summary, "costs": cost_rows, "args": {k: str(v) for k, v in vars(args).items()},
                                    "markdown": lines, "minutes": minutes, "machine": record}, indent=1) + "\n")


if __name__ == "__main__":
    main()
