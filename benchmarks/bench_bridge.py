"""Cuts that pay without a training run, certified: the search before (a sequence per repair, the error split over
them) against one sequence at the full confidence (``truncate --strategy auto`` now).

Arms, fixed before running (each at confidence 0.95 and the default budget of 16 healed candidates):

- ``drop``: ``--bridge none --epochs 0`` — cuts as they are, one sequence (the same before and now);
- ``drop+heal``, ``bridge``, ``bridge+heal``: the search *before* with those repairs: the cuts as they are (each
  bridged when that agreed better with the uncut model on the calibration digits), then the same cuts screened
  (healed a quarter of the full heal of 2 epochs) in a second sequence, the winner healed afresh in full and tested
  on its own; 1 − confidence split evenly over those parts, the full heal's share further over the 16 positions;
- ``now: drop+heal``, ``now: bridge``, ``now: bridge+heal`` (the default): one sequence at the whole 1 − confidence,
  each cut repaired before it is tested as ``CutRepair.choose`` decides on the calibration digits — as it is when
  it would qualify with its rates of discordant calibration digits, else bridged when that would, else healed in
  full (2 epochs) from the cut as it is.

Models: the four of ``bench_guarantee.py`` (identity-padded, nearly idle and fully trained 4-/6-block digits
ViTs, 10 epochs), ``demo`` (the demo's 12-block width-64 ViT, its recipe: 12 epochs at lr 2e-3) and
``deep-24`` (an over-deep model of ``bench_depth.py``: 24 blocks, width 64, its recipe: 12 epochs at lr 3e-3),
all trained on the 4,000 healing digits of ``--data mnist``. Every cut an arm tests is judged, bridged and healed
at most once, on the healing digits only (the first 1,000 are the calibration digits), and its predictions on all
1,000 held-out digits kept; a case is one seeded split of those into 500 validation and 500 test digits, as in
``bench_guarantee.py`` (no repair reads a held-out digit, so choosing among them on a fresh split is what
``truncate`` would do on it).

Per arm and max drop (1, 3, 5 points): certified cuts, blocks removed, test drop and coverage (the share of
cases whose delivered model's test drop is within the max drop; the claim is at least 95 %), and the repair
compute a run of that case spends: FLOPs (``torch.utils.flop_counter``: the uncut stream's pass, each cut's
prediction passes and bridge fit, the heals' forward and backward) and seconds (measured under the same counter).
The goals, checked in ``summary["goals"]``: every repair arm of the search now removes at least as many blocks as
``drop`` at every max drop; the default removes at least 1.25× the blocks of ``drop+heal`` (before) at 3 points;
choosing the bridge (``now: bridge``) costs at most a tenth of ``drop+heal``'s (before) repair FLOPs; coverage at
least 95 % in every group.

    python benchmarks/bench_bridge.py --threads 2      # 6 models x 10 splits x 3 max drops x 7 arms
    python benchmarks/bench_bridge.py --quick          # smoke: padded-a, 1 epoch, 1 split, 3 points, 8 heal steps
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_guarantee import MODELS as GUARANTEE_MODELS  # noqa: E402
from bench_guarantee import HeldOutScorer, repaired_base  # noqa: E402
from bench_guarantee import train as train_guarantee  # noqa: E402
from machine import machine  # noqa: E402

from isiwatch._utils.files import write_json  # noqa: E402
from isiwatch._utils.threads import add_threads_argument, current_load, set_torch_threads  # noqa: E402
from isiwatch.io.data import DIGITS_TRAIN, embedded_digits  # noqa: E402
from isiwatch.io.timm_data import first_images  # noqa: E402
from isiwatch.measure.flops import count_flops  # noqa: E402
from isiwatch.truncation.confidence import AcceptanceRule, PairedDrop, SearchGuarantee  # noqa: E402
from isiwatch.truncation.healing import DIGITS_VIT_ARCH, make_digits_vit, predict, train_classifier  # noqa: E402
from isiwatch.truncation.plan import TruncationPlan, plan  # noqa: E402
from isiwatch.truncation.request import TruncateRequest  # noqa: E402
from isiwatch.truncation.search import CutSearch  # noqa: E402
from isiwatch.truncation.strategies import DEFAULT_BUDGET, DEFAULT_CONFIDENCE  # noqa: E402
from isiwatch.truncation.surgery import CutRepair  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "bridge"
#: Arm: (bridge fit, heals, the search now: one sequence).
ARMS = {"drop": ("none", False, True), "drop+heal": ("none", True, False), "bridge": ("lstsq", False, False),
        "bridge+heal": ("lstsq", True, False), "now: drop+heal": ("none", True, True),
        "now: bridge": ("lstsq", False, True), "now: bridge+heal": ("lstsq", True, True)}
#: The arm of truncate's defaults now.
DEFAULT_ARM = "now: bridge+heal"
#: The search before: a screening heal was this share of the full heal (at least one step).
SCREEN_FRACTION = 0.25
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


class CountedRepair(CutRepair):
    """`CutRepair` that measures each judgement and bridge fit the first time it is made and adds its key to
    ``spent`` (the arm run's set) whenever it is used."""

    def __init__(self, uncut: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, method: str,
                 costs: dict):
        super().__init__(uncut, images, labels, method)
        self.costs, self.spent = costs, set()

    def judge(self, kept: list[int], name: str) -> PairedDrop:
        key = ("judge", tuple(kept), self.method, name)
        if key not in self.costs:
            self.costs[key] = measured(lambda: super(CountedRepair, self).judge(kept, name))
        self.spent.add(key)
        return super().judge(kept, name)

    def judge_healed(self, kept: list[int], model: torch.nn.Module) -> PairedDrop:
        key = ("judge", tuple(kept), self.method, "healed")
        if key not in self.costs:
            self.costs[key] = measured(lambda: super(CountedRepair, self).judge_healed(kept, model))
        self.spent.add(key)
        return super().judge_healed(kept, model)

    def bridged(self, kept: list[int]) -> bool:
        key = ("fit", tuple(kept), self.method)
        if key not in self.costs:
            self.costs[key] = measured(lambda: super(CountedRepair, self).bridged(kept))
        self.spent.add(key)
        return super().bridged(kept)


class Candidates:
    """The cuts of one model the arms tested, each judged, bridged and healed at most once, what each of those
    cost, and each repaired model's correctness on the held-out digits."""

    def __init__(self, planned: TruncationPlan, calibration: int):
        self.plan, self.depth = planned, planned.depth
        self.labels = torch.cat([planned.split.val_y, planned.split.test_y])
        self.uncut = predict(planned.uncut, planned.split.held_out_x) == self.labels
        images, labels = first_images(planned.split.probe_x, calibration)
        self.costs: dict[tuple, tuple[int, float]] = {}  # ("judge" | "fit", kept, fit, ...) or a heal's key
        self.repairs = {fit: CountedRepair(planned.uncut, images, labels, fit, self.costs)
                        for fit in {f for f, _, _ in ARMS.values()}}
        self.stream_cost = {fit: measured(lambda r=repair: r.stream.reference) for fit, repair in self.repairs.items()}
        self.correct: dict[tuple, torch.Tensor] = {}
        self.states: dict[tuple, dict] = {}  # a heal's key: the healed weights

    def spending(self, fit: str) -> set[tuple]:
        """A fresh record of what one arm run uses (judgements, fits, heals)."""
        self.repairs[fit].spent = set()
        return self.repairs[fit].spent

    def of(self, kept: list[int], fit: str, base: str, steps: int, spent: set[tuple] | None = None) -> torch.Tensor:
        """Held-out correctness of the cut keeping ``kept`` as cut or bridged (``base``), healed ``steps``."""
        key = (tuple(kept), fit if base == "bridged" else "", base, steps)  # a cut as it is: one for every fit
        if key not in self.correct:
            model = copy.deepcopy(self.repairs[fit].variants(kept)[base][0])
            self.costs[key] = measured(lambda: self.plan.heal(model, steps)) if steps else (0, 0.0)
            self.states[key] = model.state_dict()
            self.correct[key] = predict(model, self.plan.split.held_out_x) == self.labels
        if spent is not None:
            spent.add(key)
        return self.correct[key]

    def healer(self, kept: list[int], fit: str, steps: int, spent: set[tuple]) -> Callable[[torch.nn.Module], int]:
        """``CutRepair.choose``'s ``heal``: the cut as it is healed ``steps`` (once; later calls load its weights)."""
        def heal(model: torch.nn.Module) -> int:
            self.of(kept, fit, "cut", steps, spent)
            model.load_state_dict(self.states[(tuple(kept), "", "cut", steps)])
            return steps
        return heal

    def pair(self, kept: list[int], fit: str, base: str, steps: int, images: torch.Tensor,
             spent: set[tuple] | None = None) -> PairedDrop:
        return PairedDrop.from_correct(self.uncut[images].tolist(),
                                       self.of(kept, fit, base, steps, spent)[images].tolist())

    def scorer(self, fit: str, val: torch.Tensor, rule: AcceptanceRule, heal_steps: int,
               spent: set[tuple]) -> HeldOutScorer:
        """The shipped scorer on the validation split ``val`` with the bridge ``fit``, healing ``heal_steps``;
        what it uses goes to ``spent``."""
        return HeldOutScorer(self.plan, self.repairs[fit], rule, self.uncut, val, heal_steps,
                             lambda kept, steps, base: self.of(kept, fit, base, steps, spent),
                             lambda kept: self.healer(kept, fit, heal_steps, spent))

    def cost(self, spent: set[tuple], fit: str) -> tuple[int, float]:
        """FLOPs and seconds of everything in ``spent``, with the uncut stream's pass when any cut was judged."""
        costs = [self.costs[k] for k in spent] + ([self.stream_cost[fit]] if any(k[0] == "judge" for k in spent)
                                                   else [])
        return sum(c[0] for c in costs), sum(c[1] for c in costs)


def run_before(cands: Candidates, arm: str, val: torch.Tensor, max_drop: float) -> dict:
    """The search before, with arm ``arm``'s options on this validation split: the cuts as they are (bridged when
    that disagreed less on the calibration digits), then screened in a second sequence, the winner healed afresh in
    full and tested on its own; 1 − confidence split evenly over the parts, the full heal's share over the
    positions."""
    fit, heals, _ = ARMS[arm]
    p = cands.plan
    full = p.heal_steps
    screen = max(1, round(SCREEN_FRACTION * full))
    parts = 3 if heals and screen < full else 2 if heals else 1
    share = (1 - DEFAULT_CONFIDENCE) / parts
    positions = max(1, min(DEFAULT_BUDGET, cands.depth - 1))
    spent, repair = cands.spending(fit), cands.repairs[fit]

    def base(kept: list[int]) -> str:
        if fit == "none" or not repair.bridged(kept):
            return "cut"
        repair.judge(kept, "bridged"), repair.judge(kept, "cut")  # then: the one that agreed better
        disagreement = repair.disagreement[tuple(kept)]
        return "bridged" if disagreement["bridged"] < disagreement["cut"] else "cut"

    rule = AcceptanceRule(max_drop, share)
    scorer = cands.scorer(fit, val, rule, 0, spent)
    order = CutSearch(cands.depth, SearchGuarantee(max_drop, DEFAULT_CONFIDENCE), DEFAULT_BUDGET, scorer.blocks_for,
                      scorer.score).fixed_order()
    qualified: list[tuple[list[int], str, int, float]] = []  # kept, base, steps, bound
    for steps, candidates in ((0, order), (screen, order[:DEFAULT_BUDGET]) if heals else (0, [])):
        for _, kept in candidates:
            chosen = base(kept)
            pair = cands.pair(kept, fit, chosen, steps, val, spent)
            if not rule.qualifies(pair):
                break
            qualified.append((kept, chosen, steps, rule.bound(pair)))
    if not qualified:
        return {"kept": list(range(cands.depth)), "base": "cut", "steps": 0, "bound": None, **dict(
            zip(("repair_flops", "repair_seconds"), cands.cost(spent, fit), strict=True))}
    kept, chosen, steps, bound = min(qualified, key=lambda q: (len(q[0]), -float(
        cands.of(q[0], fit, q[1], q[2])[val].float().mean())))
    if steps and parts == 3:
        pair, rule = cands.pair(kept, fit, chosen, full, val, spent), AcceptanceRule(max_drop, share / positions)
        if rule.qualifies(pair):
            steps, bound = full, rule.bound(pair)
    flops, seconds = cands.cost(spent, fit)
    return {"kept": kept, "base": chosen, "steps": steps, "bound": bound, "repair_flops": flops,
            "repair_seconds": seconds}


def run_now(cands: Candidates, arm: str, val: torch.Tensor, max_drop: float) -> dict:
    """The search now (`CutSearch` through the shipped `CandidateScorer`, as ``auto_cut`` runs it) with arm
    ``arm``'s options on this validation split."""
    fit, heals, _ = ARMS[arm]
    full = cands.plan.heal_steps if heals else 0
    guarantee = SearchGuarantee(max_drop, DEFAULT_CONFIDENCE)
    spent = cands.spending(fit)
    scorer = cands.scorer(fit, val, guarantee.rule, full, spent)
    winner = CutSearch(cands.depth, guarantee, DEFAULT_BUDGET, scorer.blocks_for, scorer.score).run()
    flops, seconds = cands.cost(spent, fit)
    if winner is None:
        return {"kept": list(range(cands.depth)), "base": "cut", "steps": 0, "bound": None, "repair_flops": flops,
                "repair_seconds": seconds}
    return {"kept": winner.kept, "base": repaired_base(winner), "steps": winner.healing_steps, "bound": winner.bound,
            "repair_flops": flops, "repair_seconds": seconds}


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
                run = (run_now if ARMS[arm][2] else run_before)(cands, arm, val, max_drop)
                kept, steps, fit, base = run["kept"], run["steps"], ARMS[arm][0], run["base"]
                test_drop = 100 * cands.pair(kept, fit, base, steps, test).drop
                rows.append({"model": name, "depth": cands.depth, "resample": resample, "max_drop": max_drop,
                             "arm": arm, "keep": len(kept), "kept": kept, "healing_steps": steps,
                             "bridged": base == "bridged",
                             "validation_bound_points": None if run["bound"] is None else 100 * run["bound"],
                             "test_drop_points": test_drop,
                             "population_drop_points": 100 * cands.pair(kept, fit, base, steps, every).drop,
                             "within_max_drop": test_drop <= max_drop + 1e-9,
                             "repair_flops": run["repair_flops"], "repair_seconds": run["repair_seconds"]})
        print(f"{name} split {resample}: " + "; ".join(
            f"{r['arm']} at {r['max_drop']:g}: K={r['keep']} test {r['test_drop_points']:+.1f}"
            for r in rows[-len(ARMS) * len(args.max_drops):]), flush=True)
    models[name] = {"depth": cands.depth, "uncut_held_out_accuracy": float(cands.uncut.float().mean()),
                    "bridges_fitted": sum(k[0] == "fit" for k in cands.costs),
                    "heals": sum(k[0] not in ("fit", "judge") and k[3] > 0 for k in cands.costs)}
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
        at = {arm: groups[f"{arm} @ {d:g}"] for arm in ARMS}
        goals[f"every repair arm now removes >= drop's blocks @ {d:g}"] = all(
            at[arm]["blocks_removed"] >= at["drop"]["blocks_removed"] for arm in ARMS if ARMS[arm][2] and arm != "drop")
        goals[f"now: bridge costs <= 1/10 of drop+heal's repair FLOPs @ {d:g}"] = (
            at["now: bridge"]["repair_flops_per_case"] <= at["drop+heal"]["repair_flops_per_case"] / 10)
        if d == 3:
            goals[f"{DEFAULT_ARM} removes >= 1.25x drop+heal's blocks @ 3"] = (
                at[DEFAULT_ARM]["blocks_removed"] >= 1.25 * at["drop+heal"]["blocks_removed"])
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
    """The goals' figures, one line per max drop: blocks removed by the search now against ``drop`` and against
    ``drop+heal`` before, and what choosing the bridge costs against ``drop+heal``'s repair FLOPs."""
    groups, lines = summary["groups"], []
    for key in sorted({k.split(" @ ")[1] for k in groups}, key=float):
        at = {arm: groups[f"{arm} @ {key}"] for arm in ARMS}
        blocks = {arm: g["blocks_removed"] for arm, g in at.items()}
        goal = " (goal ≥ 1.25×)" if float(key) == 3 else ""
        lines.append(f"- Max drop {key}: `drop` removes {blocks['drop']} blocks; now `bridge` "
                     f"{blocks['now: bridge']}, `drop+heal` {blocks['now: drop+heal']} and `bridge+heal` (the "
                     f"default) {blocks[DEFAULT_ARM]} (before: {blocks['bridge']}, {blocks['drop+heal']} and "
                     f"{blocks['bridge+heal']}); the default removes "
                     f"{blocks[DEFAULT_ARM] / max(blocks['drop+heal'], 1):.2f}× the blocks of `drop+heal` before"
                     f"{goal}; now `bridge` spends "
                     f"{at['now: bridge']['repair_flops_per_case'] / at['drop+heal']['repair_flops_per_case']:.2f}× "
                     "`drop+heal`'s repair FLOPs before (goal ≤ 0.10×).")
    return lines


def figure(result: dict, path: Path) -> Path:
    """Blocks removed and repair GFLOPs per case, per arm and max drop."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = result["summary"]["groups"]
    drops = sorted({float(k.split(" @ ")[1]) for k in groups})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
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
    axes[0].legend(fontsize=7, ncol=2)
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
