"""Cuts that pay without a training run: the linear bridge (``truncate --bridge``) against healing, certified.

Arms, fixed before running (each is what ``truncate --strategy auto`` does with those options, at confidence
0.95 and the default budget):

- ``drop``: ``--bridge none --epochs 0`` — cuts as they are (one sequence);
- ``drop+heal``: ``--bridge none`` — today's default search: cuts as they are, then screened heals (a quarter of
  the full heal of 2 epochs), the winner healed in full;
- ``bridge``: ``--epochs 0`` — each cut bridged (least squares, ridge 1e-3, the first 1,000 healing digits)
  when that agrees better with the uncut model on those digits, else as it is; no training;
- ``bridge+heal``: the new default — the same cuts, then healed from them as ``drop+heal`` heals.

Models: the four of ``bench_guarantee.py`` (identity-padded, nearly idle and fully trained 4-/6-block digits
ViTs, 10 epochs), ``demo`` (the demo's 12-block width-64 ViT, its recipe: 12 epochs at lr 2e-3) and
``deep-24`` (an over-deep model of ``bench_depth.py``: 24 blocks, width 64, its recipe: 12 epochs at lr 3e-3),
all trained on the 4,000 healing digits of ``--data mnist``. Every candidate an arm tests is repaired once, on
the healing digits only, and its predictions on all 1,000 held-out digits kept; a case is one seeded split of
those into 500 validation and 500 test digits, as in ``bench_guarantee.py`` (no candidate reads a held-out
digit, so choosing among them on a fresh split is what ``truncate`` would do on it).

Per arm and max drop (1, 3, 5 points): certified cuts, blocks removed, test drop and coverage (the share of
cases whose delivered model's test drop is within the max drop; the claim is at least 95 %), and the repair
compute a run of that case spends: FLOPs (``torch.utils.flop_counter``: the bridge's forward passes and solve,
the heals' forward and backward) and seconds (measured under the same counter, so both arms carry its
overhead). The goals, checked in ``summary["goals"]``: ``bridge`` removes at least as many blocks as
``drop+heal`` for at most a tenth of its FLOPs, ``bridge+heal`` at least 25 % more blocks than ``drop+heal``
at 3 points, coverage at least 95 % in every group.

    python benchmarks/bench_bridge.py --threads 1      # 6 models x 10 splits x 3 max drops x 4 arms
    python benchmarks/bench_bridge.py --quick          # smoke: padded-a, 1 epoch, 1 split, 3 points, 8 heal steps
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_guarantee import MODELS as GUARANTEE_MODELS  # noqa: E402
from bench_guarantee import train as train_guarantee  # noqa: E402
from machine import machine  # noqa: E402

from isiwatch._utils.files import write_json  # noqa: E402
from isiwatch._utils.threads import add_threads_argument, current_load, set_torch_threads  # noqa: E402
from isiwatch.io.data import DIGITS_TRAIN, embedded_digits  # noqa: E402
from isiwatch.io.timm_data import first_images  # noqa: E402
from isiwatch.measure.flops import count_flops  # noqa: E402
from isiwatch.truncation.confidence import PairedDrop, SearchGuarantee  # noqa: E402
from isiwatch.truncation.healing import DIGITS_VIT_ARCH, make_digits_vit, predict, train_classifier  # noqa: E402
from isiwatch.truncation.search import CutSearch, Score  # noqa: E402
from isiwatch.truncation.strategies import DEFAULT_BUDGET, DEFAULT_CONFIDENCE  # noqa: E402
from isiwatch.truncation.surgery import CutRepair  # noqa: E402
from isiwatch.truncation.truncate import TruncateRequest, TruncationPlan, choose_blocks, plan  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "bridge"
#: Arm: (bridge fit, heals).
ARMS = {"drop": ("none", False), "drop+heal": ("none", True), "bridge": ("lstsq", False),
        "bridge+heal": ("lstsq", True)}
#: Models trained here: name -> (depth, epochs, lr), seed 0, width 64 (make_digits_vit).
DIGITS_MODELS = {"demo": (12, 12, 2e-3), "deep-24": (24, 12, 3e-3)}
CALIBRATION_IMAGES = 1000


def train(name: str, epochs: int | None, work: Path, device: str) -> Path:
    """The checkpoint of model ``name`` (``epochs`` overrides its recipe's), trained on ``device`` and kept in
    ``work`` between runs."""
    if name in GUARANTEE_MODELS:
        return train_guarantee(name, epochs or 10, work, device)
    depth, recipe_epochs, lr = DIGITS_MODELS[name]
    epochs = epochs or recipe_epochs
    path = work / f"{name}-e{epochs}.pt"
    if not path.exists():
        model, kwargs = make_digits_vit(0, depth=depth)
        images, labels = embedded_digits()
        train_classifier(model.to(device), images[:DIGITS_TRAIN], labels[:DIGITS_TRAIN], epochs=epochs, lr=lr,
                         batch_size=128, seed=0)
        torch.save({"arch": DIGITS_VIT_ARCH, "model_kwargs": kwargs, "state_dict": model.cpu().eval().state_dict()},
                   path)
    return path


def measured(fn: Callable[[], object]) -> tuple[int, float]:
    """FLOPs and seconds of ``fn`` (a CUDA device's queue drained before and after)."""
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    flops = count_flops(fn)
    if cuda:
        torch.cuda.synchronize()
    return flops, time.perf_counter() - start


class Candidates:
    """The cuts of one model the arms tested, each repaired once (bridge fit, heal steps), the cost of each
    bridge and each heal, and its correctness on the held-out digits."""

    def __init__(self, planned: TruncationPlan, calibration: int):
        self.plan, self.depth = planned, planned.depth
        self.labels = torch.cat([planned.split.val_y, planned.split.test_y])
        self.uncut = predict(planned.uncut, planned.split.held_out_x) == self.labels
        images = first_images(planned.split.probe_x, calibration)[0]
        self.repairs = {fit: CutRepair(planned.uncut, None if fit == "none" else images, fit)
                        for fit in {f for f, _ in ARMS.values()}}
        self.correct: dict[tuple, torch.Tensor] = {}
        self.bridge_cost: dict[tuple, tuple[int, float]] = {}  # (kept, fit): FLOPs, seconds of fitting and choosing
        self.heal_cost: dict[tuple, tuple[int, float]] = {}  # (kept, fit, steps): FLOPs, seconds of healing
        self.bridged: dict[tuple, bool] = {}  # (kept, fit): whether the cut was bridged

    def blocks_for(self, strategy: str, keep: int) -> list[int] | None:
        p = self.plan
        if strategy == "plateau" and p.phases is None:
            return None
        return choose_blocks(strategy, self.depth, keep, phases=p.phases, distances=p.distances, seed=0)

    def of(self, kept: list[int], fit: str, steps: int) -> torch.Tensor:
        key = (tuple(kept), fit, steps)
        if key not in self.correct:
            repaired: list = []
            cost = measured(lambda: repaired.append(self.repairs[fit](kept)))
            model, record = repaired[0]
            self.bridge_cost.setdefault(key[:2], cost)  # the first call fits; later ones copy the chosen cut
            self.bridged[key[:2]] = record is not None
            self.heal_cost[key] = measured(lambda: self.plan.heal(model, steps)) if steps else (0, 0.0)
            self.correct[key] = predict(model, self.plan.split.held_out_x) == self.labels
        return self.correct[key]

    def pair(self, kept: list[int], fit: str, steps: int, images: torch.Tensor) -> PairedDrop:
        return PairedDrop.from_correct(self.uncut[images].tolist(), self.of(kept, fit, steps)[images].tolist())


def run_arm(cands: Candidates, arm: str, val: torch.Tensor, max_drop: float) -> dict:
    """What ``truncate`` with arm ``arm``'s options delivers on this validation split: kept blocks, steps,
    bound, whether the delivered cut is bridged, and the repair compute of every candidate it tested (each cut's
    bridge fitted once, each heal counted)."""
    fit, heals = ARMS[arm]
    p = cands.plan
    screen, full = p.screen_steps, p.heal_steps
    parts = ("cut", "healed", "full heal")[:3 if heals and screen < full else 2 if heals else 1]
    guarantee = SearchGuarantee(max_drop, DEFAULT_CONFIDENCE, min(DEFAULT_BUDGET, cands.depth - 1), parts)
    spent: set[tuple] = set()

    def score(strategy: str, kept: list[int], healed: bool) -> Score:
        steps = screen if healed else 0
        spent.add((tuple(kept), fit, steps))
        correct = cands.of(kept, fit, steps)[val]
        return Score(0.0, float(correct.float().mean()), cands.pair(kept, fit, steps, val), steps)
    winner = CutSearch(cands.depth, guarantee, DEFAULT_BUDGET, cands.blocks_for, score).run()
    kept, steps, bound = list(range(cands.depth)), 0, None
    if winner is not None:
        kept, steps, bound = winner.kept, winner.healing_steps, winner.bound
        if winner.chain == "healed" and guarantee.rehealed:
            spent.add((tuple(kept), fit, full))
            pair, rule = cands.pair(kept, fit, full, val), guarantee.rule("full heal")
            if rule.qualifies(pair):
                steps, bound = full, rule.bound(pair)
    costs = [cands.bridge_cost[k] for k in {key[:2] for key in spent}] + [cands.heal_cost[k] for k in spent]
    return {"kept": kept, "steps": steps, "bound": bound,
            "bridged": len(kept) < cands.depth and cands.bridged[(tuple(kept), fit)],
            "repair_flops": sum(c[0] for c in costs), "repair_seconds": sum(c[1] for c in costs)}


def run_model(name: str, args: argparse.Namespace, models: dict) -> list[dict]:
    """Every case of one model: each arm at each max drop on each seeded split of its held-out digits."""
    path = train(name, args.epochs, args.work, args.device)
    planned = plan(TruncateRequest(path, data="mnist", workers=0, images=args.images, heal_steps=args.heal_steps,
                                   device=args.device))
    cands = Candidates(planned, args.images)
    held = len(cands.labels)
    rows = []
    for resample in range(args.resamples):
        order = torch.randperm(held, generator=torch.Generator().manual_seed(1000 + resample))
        val, test, every = order[:held // 2], order[held // 2:], torch.arange(held)
        for max_drop in args.max_drops:
            for arm in ARMS:
                run = run_arm(cands, arm, val, max_drop)
                kept, steps, fit = run["kept"], run["steps"], ARMS[arm][0]
                test_drop = 100 * cands.pair(kept, fit, steps, test).drop
                rows.append({"model": name, "depth": cands.depth, "resample": resample, "max_drop": max_drop,
                             "arm": arm, "keep": len(kept), "kept": kept, "healing_steps": steps,
                             "bridged": run["bridged"],
                             "validation_bound_points": None if run["bound"] is None else 100 * run["bound"],
                             "test_drop_points": test_drop,
                             "population_drop_points": 100 * cands.pair(kept, fit, steps, every).drop,
                             "within_max_drop": test_drop <= max_drop + 1e-9,
                             "repair_flops": run["repair_flops"], "repair_seconds": run["repair_seconds"]})
        print(f"{name} split {resample}: " + "; ".join(
            f"{r['arm']} at {r['max_drop']:g}: K={r['keep']} test {r['test_drop_points']:+.1f}"
            for r in rows[-len(ARMS) * len(args.max_drops):]), flush=True)
    models[name] = {"depth": cands.depth, "uncut_held_out_accuracy": float(cands.uncut.float().mean()),
                    "bridges_fitted": len(cands.bridge_cost), "heals": sum(k[2] > 0 for k in cands.heal_cost)}
    return rows


def summarise(rows: list[dict]) -> tuple[dict, list[str]]:
    """Per arm and max drop: cases, cuts, blocks removed, test drop, coverage, repair compute; the goals."""
    groups: dict = {}
    lines = ["| max drop | arm | cases | certified cuts (bridged) | blocks removed | mean test drop | coverage | "
             "repair GFLOPs / case | repair s / case |", "|---" * 9 + "|"]
    for max_drop in sorted({r["max_drop"] for r in rows}):
        for arm in ARMS:
            group = [r for r in rows if r["arm"] == arm and r["max_drop"] == max_drop]
            entry = {"cases": len(group), "cuts": sum(r["keep"] < r["depth"] for r in group),
                     "bridged_cuts": sum(r["bridged"] for r in group),
                     "blocks_removed": sum(r["depth"] - r["keep"] for r in group),
                     "mean_test_drop_points": statistics.fmean(r["test_drop_points"] for r in group),
                     "coverage": statistics.fmean(r["within_max_drop"] for r in group),
                     "repair_flops_per_case": statistics.fmean(r["repair_flops"] for r in group),
                     "repair_seconds_per_case": statistics.fmean(r["repair_seconds"] for r in group)}
            groups[f"{arm} @ {max_drop:g}"] = entry
            lines.append(f"| {max_drop:g} | {arm} | {entry['cases']} | {entry['cuts']} ({entry['bridged_cuts']}) | "
                         f"{entry['blocks_removed']} | {entry['mean_test_drop_points']:+.2f} | "
                         f"{100 * entry['coverage']:.0f} % | {entry['repair_flops_per_case'] / 1e9:.2f} | "
                         f"{entry['repair_seconds_per_case']:.1f} |")
    drops = sorted({r["max_drop"] for r in rows})
    goals = {"coverage >= 95 % everywhere": all(g["coverage"] >= 0.95 for g in groups.values())}
    for d in drops:
        bridge, healed, both = (groups[f"{arm} @ {d:g}"] for arm in ("bridge", "drop+heal", "bridge+heal"))
        goals[f"bridge removes >= drop+heal's blocks at <= 1/10 of its FLOPs @ {d:g}"] = (
            bridge["blocks_removed"] >= healed["blocks_removed"]
            and bridge["repair_flops_per_case"] <= healed["repair_flops_per_case"] / 10)
        if d == 3:
            goals["bridge+heal removes >= 1.25x drop+heal's blocks @ 3"] = (
                both["blocks_removed"] >= 1.25 * healed["blocks_removed"])
    lines += ["", "Goals: " + "; ".join(f"{k}: {'yes' if v else 'no'}" for k, v in goals.items())]
    return {"groups": groups, "goals": goals}, lines


def per_model(rows: list[dict], max_drop: float) -> list[str]:
    """Mean blocks removed per model and arm at ``max_drop`` (over its splits), with the depth."""
    models = list(dict.fromkeys(r["model"] for r in rows))
    lines = [f"| model (depth) | {' | '.join(ARMS)} |", "|---" * (len(ARMS) + 1) + "|"]
    for name in models:
        cells = []
        for arm in ARMS:
            group = [r for r in rows if r["model"] == name and r["arm"] == arm and r["max_drop"] == max_drop]
            cells.append(f"{statistics.fmean(r['depth'] - r['keep'] for r in group):.1f}")
        depth = next(r["depth"] for r in rows if r["model"] == name)
        lines.append(f"| {name} ({depth}) | {' | '.join(cells)} |")
    return lines


def findings(summary: dict) -> list[str]:
    """The goals' figures, one line per max drop: blocks removed and repair FLOPs of the bridge against
    drop+heal."""
    groups, lines = summary["groups"], []
    for key in sorted({k.split(" @ ")[1] for k in groups}, key=float):
        bridge, healed, both = (groups[f"{arm} @ {key}"] for arm in ("bridge", "drop+heal", "bridge+heal"))
        goal = "; goal ≥ 1.25×" if float(key) == 3 else ""
        lines.append(f"- Max drop {key}: `bridge` removes {bridge['blocks_removed']} blocks against "
                     f"`drop+heal`'s {healed['blocks_removed']} "
                     f"({bridge['blocks_removed'] / max(healed['blocks_removed'], 1):.2f}×) for "
                     f"{bridge['repair_flops_per_case'] / healed['repair_flops_per_case']:.2f}× its repair FLOPs "
                     f"(goal: ≥ 1× the blocks at ≤ 0.10× the FLOPs); `bridge+heal` removes "
                     f"{both['blocks_removed']} ({both['blocks_removed'] / max(healed['blocks_removed'], 1):.2f}×"
                     f"{goal}).")
    return lines


def figure(result: dict, path: Path) -> Path:
    """Blocks removed and repair GFLOPs per case, per arm and max drop."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = result["summary"]["groups"]
    drops = sorted({float(k.split(" @ ")[1]) for k in groups})
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    width = 0.8 / len(ARMS)
    for i, arm in enumerate(ARMS):
        at = [groups[f"{arm} @ {d:g}"] for d in drops]
        xs = [j + i * width for j in range(len(drops))]
        axes[0].bar(xs, [g["blocks_removed"] for g in at], width, label=arm)
        axes[1].bar(xs, [g["repair_flops_per_case"] / 1e9 for g in at], width, label=arm)  # drop: 0, no bar
    cases = next(iter(groups.values()))["cases"]
    for ax, label in zip(axes, (f"blocks removed (sum over {cases} cases)", "repair GFLOPs per case (log; drop: 0)"),
                         strict=True):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(drops))], [f"max drop {d:g}" for d in drops])
        ax.set_ylabel(label)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    models = len(result["models"])
    fig.suptitle(f"Certified cuts by repair: {models} models, {cases} cases per bar (validation n=500, test n=500 "
                 "digits each)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=[*GUARANTEE_MODELS, *DIGITS_MODELS],
                        choices=[*GUARANTEE_MODELS, *DIGITS_MODELS])
    parser.add_argument("--resamples", type=int, default=10, help="seeded validation/test splits per model")
    parser.add_argument("--max-drops", type=float, nargs="+", default=[1.0, 3.0, 5.0])
    parser.add_argument("--epochs", type=int, help="training epochs of every model (default: each one's recipe)")
    parser.add_argument("--images", type=int, default=CALIBRATION_IMAGES,
                        help="healing images the bridge is fitted on (truncate --images)")
    parser.add_argument("--heal-steps", type=int, help="steps of a full heal (default: truncate's, 2 epochs)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: padded-a, 1 epoch, 1 split, 3 points, 200 calibration digits, 8 heal steps")
    parser.add_argument("--device", default="cpu", help="where models train, heal and are bridged (cpu, cuda)")
    parser.add_argument("--figure", action="store_true", help="only draw the figure from the committed JSON")
    parser.add_argument("--work", type=Path, default=Path("/tmp/isiwatch-bench-bridge"))
    parser.add_argument("--results", type=Path, default=RESULTS)
    add_threads_argument(parser)
    args = parser.parse_args()
    if args.quick:
        args.models, args.epochs, args.resamples, args.max_drops = ["padded-a"], 1, 1, [3.0]
        args.images, args.heal_steps = 200, 8
    if args.figure:
        print(figure(json.loads((args.results / "bridge.json").read_text()), args.results / "bridge.png"))
        return
    threads = set_torch_threads(args.threads)
    record = machine(threads, args.device)
    args.work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    models: dict = {}
    rows: list[dict] = []
    for name in args.models:  # the JSON is rewritten after each model: a run cut short keeps what it finished
        rows += run_model(name, args, models)
        summary, lines = summarise(rows)
        record.update(load_1min_end=round(current_load(), 2), seconds=round(time.perf_counter() - start))
        write_json(args.results / ("bridge_quick.json" if args.quick else "bridge.json"),
                   {"summary": summary, "markdown": lines, "models": models, "rows": rows, "machine": record,
                    "complete": len(models) == len(args.models), "args": {k: str(v) for k, v in vars(args).items()}})
    print("\n".join(lines))
    if not args.quick:
        figure(json.loads((args.results / "bridge.json").read_text()), args.results / "bridge.png")


if __name__ == "__main__":
    main()
