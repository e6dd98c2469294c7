"""The truncation report: what it measures (parameters, FLOPs, latency, held-out accuracy and agreement of the
uncut, cut and healed models) and how it reads as terminal tables. The HTML run report shows the same rows."""

from __future__ import annotations

import statistics
from typing import Any

from torch import Tensor, nn

from ..io.checkpoint import Checkpoint
from ..measure.tables import format_table
from .classifier_layout import block_list
from .cost import count_parameters, differs, forward_flops, latency_samples


def measure(ckpt: Checkpoint, uncut: nn.Module, model: nn.Module, images: Tensor, labels: Tensor,
            reference: Tensor, before: Tensor, after: Tensor) -> dict[str, Any]:
    """Costs (parameters, FLOPs per image, median latency of a batch) and held-out accuracies;
    ``latency_differs``: whether the two latencies differ by more than their noise (`differs`)."""
    batch = images[:64].to(next(uncut.parameters()).device)
    times = latency_samples({"uncut": uncut, "truncated": model}, batch)
    cost = {name: {"blocks": len(block_list(m)), "parameters": count_parameters(m),
                   "flops_per_image": forward_flops(m, batch[:1]), "latency_ms": statistics.median(times[name])}
            for name, m in (("uncut", uncut), ("truncated", model))}
    return {"source": {"checkpoint": str(ckpt.path), "sha256": ckpt.sha256, "arch": ckpt.arch},
            "held_out_images": len(labels), "latency_batch": len(batch), "cost": cost,
            "latency_differs": differs(times["uncut"], times["truncated"]),
            "accuracy": {name: float((p == labels).float().mean())
                         for name, p in (("uncut", reference), ("cut", before), ("healed", after))},
            "agreement": {name: float((p == reference).float().mean()) for name, p in (("cut", before),
                                                                                     ("healed", after))}}


def _points(value: float) -> str:
    return f"{value:.2f} point{'' if value == 1 else 's'}"


def report_rows(report: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """Before/after header and rows: blocks, parameters, FLOPs, latency, speed-up, held-out accuracy,
    agreement. An uncut result (nothing was cut) is one row; a speed-up within the latency noise reads so."""
    cost, acc, agree = report["cost"], report["accuracy"], report["agreement"]
    header = ["model", "blocks", "params", "MFLOPs/img", f"latency ms/{report['latency_batch']}", "speed-up",
              "accuracy", "agreement"]
    uncut, truncated = cost["uncut"], cost["truncated"]
    rows = [["uncut", uncut["blocks"], uncut["parameters"], uncut["flops_per_image"] / 1e6, uncut["latency_ms"], "",
             acc["uncut"], 1.0]]
    if truncated["blocks"] == uncut["blocks"]:
        return header, rows
    speedup = (f"{uncut['latency_ms'] / truncated['latency_ms']:.2f}x" if report.get("latency_differs", True)
               else "within noise")
    for name in ("cut", "healed"):
        rows.append([name, truncated["blocks"], truncated["parameters"], truncated["flops_per_image"] / 1e6,
                     truncated["latency_ms"], speedup, acc[name], agree.get(name, 1.0)])
    return header, rows


def candidates_table(report: dict[str, Any]) -> str:
    """Every cut ``auto`` scored, in testing order (as cuts, then healed): its repair (none, bridge, heal,
    bridge+heal), validation accuracies, the paired drop and its bound, healing steps (0: not healed), costs, the
    verdict."""
    search = report["search"]
    header = ["strategy", "blocks", "kept", "repair", "heal steps", "val cut", "val healed", "val drop", "bound",
              "params", "MFLOPs/img", f"latency ms/{search.get('latency_batch', 64)}", ""]
    rows = [[c["strategy"], c["keep"], ",".join(map(str, c["kept_blocks"])), c.get("repair", "-"), c["healing_steps"],
             c["validation_accuracy"]["cut"], c["validation_accuracy"]["healed"],
             f"{c['validation_drop']['points']:.2f}", f"{c['validation_drop']['upper_bound_points']:.2f}",
             c["parameters"], c["flops_per_image"] / 1e6, c["latency_ms"],
             "winner" if c["winner"] else ("ok" if c["qualifies"] else "")]
            for c in search["candidates"]]
    return f"{rule_line(search)}\n{format_table(header, rows)}" if rows else rule_line(search)


def rule_line(search: dict[str, Any]) -> str:
    """How ``auto`` judged its candidates, in one line."""
    rule = search["rule"]
    points = f"{rule['max_drop']:g} point{'' if rule['max_drop'] == 1 else 's'}"
    if rule["confidence"] == 0:
        how = f"its validation drop (a point estimate) is within {points}"
    else:
        how = (f"the upper {100 * rule['confidence']:g} % confidence bound of its validation drop (exact) is "
               f"within {points}, tested in a fixed order from the fewest blocks dropped, each cut as it is, then "
               f"healed, each sequence stopping at its first failure")
    screened = (f"; each healed candidate screened with {search['screen_steps']} healing steps"
                if "healed" in rule["parts"] else "; no healing (0 steps): cuts only")
    bridge = search.get("bridge") or {"method": "none"}  # reports written before the bridge have none
    bridged = ("" if bridge["method"] == "none" else
               f"; each cut bridged ({bridge['method']}) when that agrees better with the uncut model on "
               f"{bridge['calibration_images']} healing images ({bridge['cuts_fitted']} fitted in "
               f"{bridge['calibration_seconds']:.1f} s)")
    return (f"uncut validation accuracy {search['uncut_validation_accuracy']:.3f} on {search['validation_images']} "
            f"images; a cut qualifies when {how}; drops and bounds in points{screened}{bridged}")


def verdict_line(report: dict[str, Any]) -> str:
    """One line: the cut ``auto`` chose with its bound and its test result, or why nothing was cut."""
    search = report["search"]
    if search["winner"] is None:
        return str(search["message"])
    winner, test, depth = search["winner"], search["test"], report["cost"]["uncut"]["blocks"]
    full = search.get("full_heal")
    judged = full if full and full["qualifies"] else winner
    bridged = "bridged, " if winner.get("repair", "").startswith("bridge") else ""
    if winner["chain"] == "cut":
        kind = f"{bridged or 'as cut, '}not healed"
    elif judged is full:
        kind = f"{bridged}full heal of {report['healing_steps']} steps"
    else:
        kind = f"{bridged}screening heal of {report['healing_steps']} steps" + (
            "; its full heal was not certified" if full else "")
    bound = judged["validation_drop"]["upper_bound_points"]
    confidence = search["rule"]["confidence"]
    how = f"upper {100 * confidence:g} % bound {bound:.2f}" if confidence else f"point estimate {bound:.2f}"
    return (f"cut to {winner['keep']} of {depth} blocks ({winner['strategy']}, {kind}): validation drop "
            f"{judged['validation_drop']['points']:.2f} points, {how} <= {search['max_drop']:g}; test drop "
            f"{_points(test['points'])} on {test['images']} images, scored once "
            f"({'within' if test['within_max_drop'] else 'beyond'} {search['max_drop']:g})")


def report_table(report: dict[str, Any]) -> str:
    """The before/after table as text, with the kept blocks and the strategy (one row when nothing was cut)."""
    if report["cost"]["truncated"]["blocks"] == report["cost"]["uncut"]["blocks"]:
        return format_table(*report_rows(report)) + f"\nuncut model kept ({report['strategy']})"
    kept = ", ".join(map(str, report["kept_blocks"]))
    return f"{format_table(*report_rows(report))}\nkept blocks {kept} ({report['strategy']})"
