"""Score every candidate depth rule against the depth sweep's "needed depth", without retraining.

Reads ``benchmarks/results/depth/sweep.json`` (needed depth per task) and the committed analyses of every
model with at least ``--min-depth`` blocks (both tasks, all seeds, both probe sets), applies each rule of
``isiwatch.measure.depth.RULES`` (plus the Gromov angular-distance rules, which need the boundary distances) and
reports, per rule and probe set, the mean absolute and mean signed error of ``depth − dropped blocks``
against the task's needed depth. A rule without a signal keeps every block. The thresholds of the
``block_influence_*`` and ``angular_*`` rules are a small fixed grid, so the best of them is chosen on the
same data it is scored on (in-sample).

    python benchmarks/score_depth_rules.py        # writes benchmarks/results/depth/rule_scores.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from isiwatch._utils.files import write_json
from isiwatch.measure.analysis import Analysis
from isiwatch.measure.depth import DEFAULT_RULES, candidate_drops, recommend_depth

RESULTS = Path(__file__).parent / "results" / "depth"
ANGLE_THRESHOLDS = (0.05, 0.1, 0.15)


def angular_drops(angle: list[list[float]], threshold: float) -> list[int]:
    """Gromov et al.: the longest run of consecutive blocks whose input and output are closer than
    ``threshold`` (angle / π); its blocks are dropped."""
    depth = len(angle) - 1
    for span in range(depth - 1, 0, -1):
        starts = [s for s in range(depth - span + 1) if angle[s][s + span] < threshold]
        if starts:
            start = min(starts, key=lambda s: angle[s][s + span])
            return list(range(start, start + span))
    return []


def score(results: Path, min_depth: int, tolerance: float) -> dict:
    sweep = json.loads((results / "sweep.json").read_text())
    needed = {name: t["needed_depth"] for name, t in sweep["tasks"].items()}
    rows = []
    for model in sweep["models"]:
        if model["depth"] < min_depth:
            continue
        stem = f"{model['task']}_d{model['depth']:02d}_s{model['seed']}"
        angle = json.loads((results / "analyses" / f"{stem}_distances.json").read_text())["angle"]
        for probe in ("train", "held_out"):
            analysis = Analysis.from_dict(json.loads((results / "analyses" / f"{stem}_{probe}.json").read_text()))
            drops = candidate_drops(analysis, tolerance)
            drops.update({f"angular_{t:g}": angular_drops(angle, t) for t in ANGLE_THRESHOLDS})
            depths = {name: model["depth"] - len(d or []) for name, d in drops.items()}
            recommendation = recommend_depth(analysis, tolerance)
            depths["recommend_depth"] = recommendation.depth
            rows.append({"task": model["task"], "depth": model["depth"], "seed": model["seed"], "probe_set": probe,
                         "needed_depth": needed[model["task"]], "recommended": depths,
                         "recommend_depth_signal": recommendation.signal})
    table = {}
    for probe in ("train", "held_out"):
        sel = [r for r in rows if r["probe_set"] == probe]
        for name in sel[0]["recommended"] if sel else []:
            errors = [r["recommended"][name] - r["needed_depth"] for r in sel]
            table.setdefault(name, {})[probe] = {"mean_abs_error": statistics.fmean(abs(e) for e in errors),
                                                 "mean_error": statistics.fmean(errors), "models": len(errors)}
    best = min((n for n in table if n != "recommend_depth"), key=lambda n: table[n]["train"]["mean_abs_error"])
    return {"needed_depth": needed, "min_depth": min_depth, "tolerance": tolerance, "rows": rows, "table": table,
            "best_rule_train_probe": best, "default_rules": list(DEFAULT_RULES)}


def markdown(result: dict) -> list[str]:
    lines = [f"Needed depth: {', '.join(f'{k} {v}' for k, v in result['needed_depth'].items())}. "
             f"Models with ≥ {result['min_depth']} blocks, error = recommended − needed depth (blocks), "
             "mean over models:", "",
             "| rule | train probe: mean abs error | mean error | held-out probe: mean abs error | mean error "
             "| models |",
             "|---|---|---|---|---|---|"]
    for name, by in sorted(result["table"].items(), key=lambda kv: kv[1]["train"]["mean_abs_error"]):
        t, h = by["train"], by["held_out"]
        lines.append(f"| {name} | {t['mean_abs_error']:.1f} | {t['mean_error']:+.1f} | {h['mean_abs_error']:.1f} | "
                     f"{h['mean_error']:+.1f} | {t['models']} |")
    lines += ["", "Per model (train probe): " + "; ".join(
        f"{r['task']} d{r['depth']} s{r['seed']} → {r['recommended']['recommend_depth']} "
        f"({r['recommend_depth_signal']})" for r in result["rows"] if r["probe_set"] == "train")]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--min-depth", type=int, default=16)
    parser.add_argument("--tolerance", type=float, default=0.01)
    args = parser.parse_args()
    result = score(args.results, args.min_depth, args.tolerance)
    result["markdown"] = markdown(result)
    print("\n".join(result["markdown"]))
    write_json(args.results / "rule_scores.json", result)


if __name__ == "__main__":
    main()
