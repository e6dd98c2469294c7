"""The guarantee of ``truncate --strategy auto`` on resampled validation/test splits: fixed-sequence testing (the
rule now) against Bonferroni over the budget (the rule before).

Models: digits ViTs (the embedded digits, ``--data mnist``'s split: 4,000 healing digits, 1,000 held out),
trained on the healing digits with seeded AdamW:

- ``padded-a``: a 4-block ViT with an exact identity block (both residual branches zeroed) after each block;
- ``padded-b``: a 4-block ViT of another seed with 4 identity blocks after its last;
- ``near-c``: a 4-block ViT of a third seed with a nearly idle block after each block (a copy of its second
  block with both residual branches scaled to 10 %: cutting it changes a few predictions);
- ``trained-6``: a 6-block ViT, every block trained.

Every candidate a rule tests is repaired once, when a rule first asks for it, on the healing digits only and with
``truncate``'s defaults (the search now: as cut, bridged or healed in full for 2 epochs, 64 steps, as the
calibration digits choose; the rule before: each candidate healed 16 steps, a quarter of the full heal, the winner
healed in full), and its predictions on all 1,000 held-out digits are kept. A case is one seeded split of the
held-out digits into 500 validation and 500 test digits. No candidate depends on the held-out digits (healing reads
the healing digits, the fixed order their block influence), so choosing among already-healed candidates on a fresh
split is what ``truncate`` would do on that split, without healing again. Each rule chooses on validation at
confidence 0.95 with the default budget, and its delivered model (the uncut one when it certifies nothing) is scored
once on test.

The summary gives, per rule and max drop: cases, certified cuts, blocks removed, coverage (the share of cases
whose delivered model's test drop is within the max drop: the claim is at least 95 %), the share within the
winner's own validation bound, the drop on all 1,000 held-out digits (the population both halves are drawn
from) and the validation images each rule needs to certify a cut that changes nothing.

    python benchmarks/bench_guarantee.py       # 4 models x 10 splits x max drop 1, 3 and 5 points, 2 rules
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import timm
import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))
from machine import machine  # noqa: E402
from test_truncate_auto import ARCH, KWARGS, padded  # noqa: E402

from isiwatch._utils.files import write_json  # noqa: E402
from isiwatch._utils.threads import add_threads_argument, current_load, set_torch_threads  # noqa: E402
from isiwatch._utils.wording import points  # noqa: E402
from isiwatch.io.data import DIGITS_TRAIN, embedded_digits  # noqa: E402
from isiwatch.io.timm_data import first_images  # noqa: E402
from isiwatch.truncation.confidence import AcceptanceRule, PairedDrop, SearchGuarantee  # noqa: E402
from isiwatch.truncation.healing import predict, train_classifier  # noqa: E402
from isiwatch.truncation.plan import TruncationPlan, plan  # noqa: E402
from isiwatch.truncation.request import TruncateRequest  # noqa: E402
from isiwatch.truncation.scoring import CandidateScorer  # noqa: E402
from isiwatch.truncation.search import Candidate, CutSearch  # noqa: E402
from isiwatch.truncation.strategies import AUTO_STRATEGIES, DEFAULT_BUDGET, DEFAULT_CONFIDENCE  # noqa: E402
from isiwatch.truncation.surgery import CutRepair, RepairChoice  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "guarantee"
#: Model name: (seed, trained blocks, idle blocks after which trained block (-1: before the first), the idle
#: blocks' residual scale: 0 an exact identity).
MODELS = {"padded-a": (0, 4, [0, 1, 2, 3], 0.0), "padded-b": (1, 4, [3, 3, 3, 3], 0.0),
          "near-c": (3, 4, [0, 1, 2, 3], 0.1), "trained-6": (2, 6, [], 0.0)}
RULES = ("fixed sequence", "Bonferroni (before)")


def train(name: str, epochs: int, work: Path, device: str = "cpu") -> Path:
    """The checkpoint of model ``name``, trained on the healing digits on ``device`` (kept in ``work`` between
    runs)."""
    path = work / f"{name}-e{epochs}.pt"
    if path.exists():
        return path
    seed, depth, idle_after, scale = MODELS[name]
    images, labels = embedded_digits()
    torch.manual_seed(seed)
    model = timm.create_model(ARCH, pretrained=False, depth=depth, **KWARGS).to(device)
    train_classifier(model, images[:DIGITS_TRAIN], labels[:DIGITS_TRAIN], epochs=epochs, lr=3e-3, batch_size=128,
                     seed=seed)
    return padded(model.cpu().eval(), idle_after, path, scale)


class Candidates:
    """The cuts of one model that the rules tested, each as cut or bridged (``base``) and healed once for the steps
    asked (0: not healed); each one's correctness on the held-out digits (validation then test halves of
    ``plan``'s split)."""

    def __init__(self, planned: TruncationPlan):
        self.plan, self.depth = planned, planned.depth
        self.labels = torch.cat([planned.split.val_y, planned.split.test_y])
        self.uncut = predict(planned.uncut, planned.split.held_out_x) == self.labels
        r = planned.request
        self.repair = CutRepair(planned.uncut, *first_images(planned.split.probe_x, r.images), r.bridge)
        self.correct: dict[tuple[tuple[int, ...], int, str], torch.Tensor] = {}
        self.states: dict[tuple[tuple[int, ...], int, str], dict] = {}  # the healed weights
        self.heals = 0

    def of(self, kept: list[int], steps: int, base: str = "cut") -> torch.Tensor:
        key = (tuple(kept), steps, base)
        if key not in self.correct:
            model = copy.deepcopy(self.repair.variants(kept)[base][0])
            if steps:
                self.plan.heal(model, steps)
                self.heals += 1
            self.states[key] = model.state_dict()
            self.correct[key] = predict(model, self.plan.split.held_out_x) == self.labels
        return self.correct[key]

    def healer(self, kept: list[int], steps: int) -> Callable[[torch.nn.Module], int]:
        """``CutRepair.choose``'s ``heal``: the cut as it is healed ``steps`` (once; later calls load its weights)."""
        def heal(model: torch.nn.Module) -> int:
            self.of(kept, steps)
            model.load_state_dict(self.states[(tuple(kept), steps, "cut")])
            return steps
        return heal

    def pair(self, kept: list[int], steps: int, images: torch.Tensor, base: str = "cut") -> PairedDrop:
        return PairedDrop.from_correct(self.uncut[images].tolist(), self.of(kept, steps, base)[images].tolist())

    def scorer(self, val: torch.Tensor, rule: AcceptanceRule, heal_steps: int) -> HeldOutScorer:
        """The shipped scorer on the validation split ``val``, healing ``heal_steps``."""
        return HeldOutScorer(self.plan, self.repair, rule, self.uncut, val, heal_steps, self.of,
                             lambda kept: self.healer(kept, heal_steps))


class HeldOutScorer(CandidateScorer):
    """The scorer ``auto_cut`` runs (`CandidateScorer`) on one validation split ``val`` (indices) of a model's
    held-out digits, whose cuts are repaired once for every split: ``of(kept, steps, base)`` is a repaired cut's
    correctness on all held-out digits (``uncut_correct``: the uncut model's), ``heal_of(kept)`` the heal
    `CutRepair.choose` calls."""

    def __init__(self, planned: TruncationPlan, repair: CutRepair, rule: AcceptanceRule, uncut_correct: torch.Tensor,
                 val: torch.Tensor, heal_steps: int, of: Callable[[list[int], int, str], torch.Tensor],
                 heal_of: Callable[[list[int]], Callable[[torch.nn.Module], int]]):
        super().__init__(planned.depth, planned.inputs, repair, rule, uncut_correct[val], heal_steps, planned.heal)
        self.val, self.of, self.heal_of = val, of, heal_of

    def healer(self, kept: list[int]) -> Callable[[torch.nn.Module], int]:
        return self.heal_of(kept)

    def correct(self, kept: list[int], repaired: RepairChoice | None) -> torch.Tensor:
        steps, base = (0, "cut") if repaired is None else (repaired.steps, repaired_base(repaired))
        return self.of(kept, steps, base)[self.val]


def repaired_base(repaired: RepairChoice | Candidate) -> str:
    """The cut a repair (or a tested candidate's) starts from: "bridged", or "cut" (as it is; a heal starts from it
    too)."""
    return "bridged" if repaired.bridge is not None else "cut"


def fixed_sequence(cands: Candidates, val: torch.Tensor,
                   max_drop: float) -> tuple[list[int], int, float | None, str]:
    """The rule now (`CutSearch` through the shipped `CandidateScorer`, as ``auto_cut`` runs them): the delivered
    model's kept blocks, healing steps, validation bound (None: nothing certified, the uncut model) and base (as
    cut or bridged)."""
    guarantee = SearchGuarantee(max_drop, DEFAULT_CONFIDENCE)
    if not guarantee.certifiable(len(val)):
        return list(range(cands.depth)), 0, None, "cut"
    scorer = cands.scorer(val, guarantee.rule, cands.plan.heal_steps)
    winner = CutSearch(cands.depth, guarantee, DEFAULT_BUDGET, scorer.blocks_for, scorer.score).run()
    if winner is None:
        return list(range(cands.depth)), 0, None, "cut"
    return winner.kept, winner.healing_steps, winner.bound, repaired_base(winner)


class Exhausted(Exception):
    """The budget is spent."""


def bonferroni(cands: Candidates, val: torch.Tensor, max_drop: float,
               start: int) -> tuple[list[int], int, float | None, str]:
    """The rule before: every bound at (1 − confidence) / (budget + 1), refused outright when even a cut that
    changes nothing cannot pass; bisection along K with the first strategy from the recommended depth, the
    other strategies just below the cheapest K found, every candidate screened; the winner healed in full and
    kept when it passes too."""
    p = cands.plan
    full = p.heal_steps
    screen = max(1, round(full / 4))  # a quarter of the full heal, as it was
    rule = AcceptanceRule(max_drop, (1 - DEFAULT_CONFIDENCE) / (DEFAULT_BUDGET + 1))
    needed = rule.images_needed()
    if needed is None or len(val) < needed:
        return list(range(cands.depth)), 0, None, "cut"
    tried: dict[tuple[int, ...], tuple[bool, float, float]] = {}  # kept: qualifies, healed accuracy, bound
    blocks_for = cands.scorer(val, rule, screen).blocks_for

    def qualifies(strategy: str, keep: int) -> bool:
        kept = blocks_for(strategy, keep)
        if kept is None:
            return False
        if tuple(kept) not in tried:
            if len(tried) >= DEFAULT_BUDGET:
                raise Exhausted
            pair = cands.pair(kept, screen, val)
            tried[tuple(kept)] = (rule.qualifies(pair), float(cands.of(kept, screen)[val].float().mean()),
                                  rule.bound(pair))
        return tried[tuple(kept)][0]

    applicable = [s for s in AUTO_STRATEGIES if blocks_for(s, 1) is not None]
    low, high, probe = 1, cands.depth, start if 1 <= start < cands.depth else None
    try:
        while low < high:
            middle = probe if probe is not None else (low + high) // 2
            probe = None
            if qualifies(applicable[0], middle):
                high = middle
            else:
                low = middle + 1
        keep = high - 1
        while keep >= 1 and any(qualifies(s, keep) for s in applicable):
            keep -= 1
    except Exhausted:
        pass
    passed = [(len(k), -acc, list(k), bound) for k, (ok, acc, bound) in tried.items() if ok]
    if not passed:
        return list(range(cands.depth)), 0, None, "cut"
    _, _, kept, bound = min(passed)
    pair = cands.pair(kept, full, val)
    if rule.qualifies(pair):
        return kept, full, rule.bound(pair), "cut"
    return kept, screen, bound, "cut"


def run_model(name: str, args: argparse.Namespace, models: dict) -> list[dict]:
    """Every case of one model: both rules at each max drop on each seeded split of its held-out digits; what
    the model is goes to ``models``."""
    path = train(name, args.epochs, args.work)
    planned = {d: plan(TruncateRequest(path, data="mnist", workers=0, max_drop=d)) for d in args.max_drops}
    cands = Candidates(planned[args.max_drops[0]])
    held = len(cands.labels)
    rows = []
    for resample in range(args.resamples):
        order = torch.randperm(held, generator=torch.Generator().manual_seed(1000 * MODELS[name][0] + resample))
        val, test, every = order[:held // 2], order[held // 2:], torch.arange(held)
        for max_drop in args.max_drops:
            start = planned[max_drop].recommendation
            for rule in RULES:
                kept, steps, bound, base = (fixed_sequence(cands, val, max_drop) if rule == RULES[0] else
                                            bonferroni(cands, val, max_drop, start.depth if start else cands.depth))
                test_drop = 100 * cands.pair(kept, steps, test, base).drop
                rows.append({"model": name, "depth": cands.depth, "resample": resample, "max_drop": max_drop,
                             "rule": rule, "keep": len(kept), "kept": kept, "healing_steps": steps,
                             "validation_bound_points": None if bound is None else 100 * bound,
                             "test_drop_points": test_drop,
                             "population_drop_points": 100 * cands.pair(kept, steps, every, base).drop,
                             "within_max_drop": test_drop <= max_drop + 1e-9,
                             "within_bound": bound is None or test_drop <= 100 * bound + 1e-9})
        print(f"{name} split {resample}: " + "; ".join(
            f"{r['rule']} at {r['max_drop']:g}: K={r['keep']} test drop {r['test_drop_points']:+.1f}"
            for r in rows[-2 * len(args.max_drops):]), flush=True)
    models[name] = {"depth": cands.depth, "heals": cands.heals,
                    "uncut_held_out_accuracy": float(cands.uncut.float().mean())}
    print(f"{name}: {cands.heals} heals, uncut held-out accuracy {models[name]['uncut_held_out_accuracy']:.3f}",
          flush=True)
    return rows


def summarise(rows: list[dict]) -> tuple[dict, list[str]]:
    """Per rule and max drop: cases, cuts, blocks removed, coverage; the cuts the fixed sequence adds."""
    summary: dict = {"groups": {}, "images_needed": {}}
    lines = ["| rule | max drop | cases | certified cuts (healed) | blocks removed | test drop ≤ max drop (coverage) | "
             "test drop ≤ own bound | worst test drop | drop on all 1,000 held out ≤ max drop |",
             "|---" * 9 + "|"]
    for max_drop in sorted({r["max_drop"] for r in rows}):
        for rule in RULES:
            group = [r for r in rows if r["rule"] == rule and r["max_drop"] == max_drop]
            entry = {"cases": len(group), "cuts": sum(r["keep"] < r["depth"] for r in group),
                     "healed_cuts": sum(r["keep"] < r["depth"] and r["healing_steps"] > 0 for r in group),
                     "blocks_removed": sum(r["depth"] - r["keep"] for r in group),
                     "coverage": statistics.fmean(r["within_max_drop"] for r in group),
                     "within_bound": statistics.fmean(r["within_bound"] for r in group),
                     "worst_test_drop_points": max(r["test_drop_points"] for r in group),
                     "population_coverage": statistics.fmean(r["population_drop_points"] <= max_drop + 1e-9
                                                             for r in group)}
            summary["groups"][f"{rule} @ {max_drop:g}"] = entry
            lines.append(f"| {rule} | {max_drop:g} | {entry['cases']} | {entry['cuts']} ({entry['healed_cuts']}) | "
                         f"{entry['blocks_removed']} | {100 * entry['coverage']:.0f} % | "
                         f"{100 * entry['within_bound']:.0f} % | {entry['worst_test_drop_points']:+.1f} | "
                         f"{100 * entry['population_coverage']:.0f} % |")
        now, before = (summary["groups"][f"{rule} @ {max_drop:g}"] for rule in RULES)
        summary[f"more_cuts @ {max_drop:g}"] = now["cuts"] - before["cuts"]
        summary[f"more_blocks_removed @ {max_drop:g}"] = now["blocks_removed"] - before["blocks_removed"]
        now_needed = SearchGuarantee(max_drop, DEFAULT_CONFIDENCE).images_needed()
        before_needed = AcceptanceRule(max_drop, (1 - DEFAULT_CONFIDENCE) / (DEFAULT_BUDGET + 1)).images_needed()
        summary["images_needed"][f"{max_drop:g}"] = {"fixed sequence": now_needed, "Bonferroni (before)": before_needed}
        more = (summary[f"more_cuts @ {max_drop:g}"], summary[f"more_blocks_removed @ {max_drop:g}"])
        lines.append(f"| | | | **{more[0]:+d} cuts, {more[1]:+d} blocks** | | | | | |")
    lines += ["", "Validation images a cut that changes nothing needs to be certified (confidence 0.95, budget "
              f"{DEFAULT_BUDGET}; now one sequence at the whole error): " + "; ".join(
                  f"{points(float(d))}: {n['fixed sequence']} (before: {n['Bonferroni (before)']})"
                  for d, n in summary["images_needed"].items())]
    return summary, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--resamples", type=int, default=10, help="seeded validation/test splits per model")
    parser.add_argument("--max-drops", type=float, nargs="+", default=[1.0, 3.0, 5.0])
    parser.add_argument("--epochs", type=int, default=10, help="training epochs of each model")
    parser.add_argument("--work", type=Path, default=Path("/tmp/isiwatch-bench-guarantee"))
    parser.add_argument("--results", type=Path, default=RESULTS)
    add_threads_argument(parser)
    args = parser.parse_args()
    threads = set_torch_threads(args.threads)
    record = machine(threads)
    args.work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    models: dict = {}
    rows = [row for name in args.models for row in run_model(name, args, models)]
    summary, lines = summarise(rows)
    print("\n".join(lines))
    record.update(load_1min_end=round(current_load(), 2), seconds=round(time.perf_counter() - start))
    write_json(args.results / "guarantee.json", {"summary": summary, "markdown": lines, "models": models,
                                                 "rows": rows, "machine": record,
                                                 "args": {k: str(v) for k, v in vars(args).items()}})


if __name__ == "__main__":
    main()
