"""The truncation report: what it measures (parameters, FLOPs, latency, held-out accuracy and agreement of the
uncut, cut and healed models) and how it reads as terminal tables. The HTML run report shows the same rows."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from .._utils.wording import points
from ..io.checkpoint import Checkpoint
from ..measure.tables import format_table
from .confidence import SearchGuarantee
from .cost import separated


def measure(ckpt: Checkpoint, uncut: dict[str, Any], truncated: dict[str, Any], split: str, labels: Tensor,
            stages: dict[str, Tensor]) -> dict[str, Any]:
    """The before/after record: the uncut and truncated models' costs (`model_costs`, measured once for the
    run), the accuracy on ``split`` (its name and size recorded with them) of each model in ``stages``
    (predictions by name, ``uncut`` first, the written model last) and each cut's agreement with the uncut
    model; ``latency_differs``: whether the two latencies' interquartile ranges are apart (`separated`)."""
    cost = {"uncut": uncut, "truncated": truncated}
    reference = stages["uncut"]
    return {"source": {"checkpoint": str(ckpt.path), "sha256": ckpt.sha256, "arch": ckpt.arch},
            "held_out_images": len(labels), "latency_batch": uncut["latency_batch"],
            "cost": {name: {k: v for k, v in c.items() if k != "latency_batch"} for name, c in cost.items()},
            "latency_differs": truncated is not uncut and separated(uncut["latency_quartiles_ms"],
                                                                    truncated["latency_quartiles_ms"]),
            "accuracy": {"split": split, "images": len(labels),
                         **{name: float((p == labels).float().mean()) for name, p in stages.items()}},
            "agreement": {name: float((p == reference).float().mean()) for name, p in stages.items()
                          if name != "uncut"}}


def accuracy_label(accuracy: dict[str, Any]) -> str:
    """What an accuracy figure is: its split and its size ("test n=500"); "held-out" for a report that does not
    record them."""
    split = accuracy.get("split", "held-out")
    return f"{split} n={accuracy['images']}" if "images" in accuracy else split


def latency_cell(cost: dict[str, Any]) -> str:
    """A latency with its spread: the median and, where recorded, the interquartile range (ms)."""
    quartiles = cost.get("latency_quartiles_ms")
    median = f"{cost['latency_ms']:.2f}"
    return f"{median} ({quartiles[0]:.2f}-{quartiles[1]:.2f})" if quartiles else median


#: Row names of the models a run makes, by their key in the report's ``accuracy`` (in the order they are made).
STAGE_NAMES = {"uncut": "uncut", "cut": "cut", "bridged": "bridged cut", "healed": "healed"}


def report_rows(report: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """Before/after header and rows: blocks, parameters, FLOPs and their ratio (the primary costs), latency
    (median and interquartile range of interleaved repeats), the wall-time speed-up only when those ranges are
    apart (else "within noise"), accuracy on its labelled split, agreement. One row per model the run made
    (`STAGE_NAMES`): the uncut model alone when nothing was cut; the last row is the written model."""
    cost, acc, agree = report["cost"], report["accuracy"], report["agreement"]
    header = ["model", "blocks", "params", "MFLOPs/img", "FLOPs", f"latency ms/{report['latency_batch']} (IQR)",
              "wall speed-up", f"accuracy {accuracy_label(acc)}", "agreement"]
    uncut, truncated = cost["uncut"], cost["truncated"]
    rows = [["uncut", uncut["blocks"], uncut["parameters"], uncut["flops_per_image"] / 1e6, "1.00x",
             latency_cell(uncut), "", acc["uncut"], 1.0]]
    if truncated["blocks"] == uncut["blocks"]:
        return header, rows
    speedup = (f"{uncut['latency_ms'] / truncated['latency_ms']:.2f}x" if report.get("latency_differs", True)
               else "within noise")
    flops = f"{truncated['flops_per_image'] / uncut['flops_per_image']:.2f}x"
    for name in (name for name in STAGE_NAMES if name != "uncut" and name in acc):
        rows.append([STAGE_NAMES[name], truncated["blocks"], truncated["parameters"],
                     truncated["flops_per_image"] / 1e6, flops, latency_cell(truncated), speedup, acc[name],
                     agree.get(name, 1.0)])
    return header, rows


def candidates_table(report: dict[str, Any]) -> str:
    """Every cut ``auto`` tested, in its one fixed order: its repair (none, bridge, heal) and what
    chose it (`choice_cell`), validation accuracies, the paired drop and its bound, healing steps (0: not healed),
    costs, the verdict."""
    search = report["search"]
    candidates = search["candidates"]
    batch = candidates[0].get("latency_batch", 64) if candidates else 64
    header = ["strategy", "blocks", "kept", "repair", "heal-image bound", "heal steps", "val cut",
              "val repaired", "val drop", "bound", "params", "MFLOPs/img", f"latency ms/{batch} (IQR)", ""]
    rows = [[c["strategy"], c["keep"], ",".join(map(str, c["kept_blocks"])), c.get("repair", "-"),
             choice_cell(c.get("choice") or {}), c["healing_steps"],
             c["validation_accuracy"]["cut"], c["validation_accuracy"]["healed"],
             f"{c['validation_drop']['points']:.2f}", f"{c['validation_drop']['upper_bound_points']:.2f}",
             c["parameters"], c["flops_per_image"] / 1e6, latency_cell(c),
             "winner" if c["winner"] else ("ok" if c["qualifies"] else "stop")]
            for c in candidates]
    return f"{rule_line(search)}\n{format_table(header, rows)}" if rows else rule_line(search)


def choice_cell(choice: dict[str, Any]) -> str:
    """What chose a candidate's repair: the upper bound (points) the cut as it is and bridged would have on the
    validation split with their rates of discordant healing images, "-" when there was nothing to choose."""
    tried = choice.get("predicted_bound_points") or {}
    return " / ".join(f"{name} {points:.2f}" for name, points in tried.items()) or "-"


def rule_line(search: dict[str, Any]) -> str:
    """How ``auto`` chose and judged its candidates, in one line."""
    rule = search["rule"]
    how = SearchGuarantee(rule["max_drop"], rule["confidence"]).describe()
    bridge = search.get("bridge") or {"method": "none", "calibration_images": 0}
    repairs = ["as it is"] + ([f"bridged ({bridge['method']})"] if bridge["method"] != "none" else []) + (
        [f"healed ({search['heal_steps']} steps, {search['budget']} candidates at most)"] if search["heal_steps"]
        else [])
    chosen = (f"; each cut {', '.join(repairs[:-1])} or {repairs[-1]}: the least repair that would qualify with its "
              f"rates of discordant images among {bridge['calibration_images']} healing images (heal-image bound)"
              if len(repairs) > 1 else "; cuts as they are (no repair)")
    return (f"uncut accuracy validation n={search['validation_images']} {search['uncut_validation_accuracy']:.3f} "
            f"(val columns: the same {search['validation_images']} images); a cut qualifies when {how}; drops and "
            f"bounds in points{chosen}")


#: How a repair reads in a sentence ("bridge+heal": reports written before issue 49).
REPAIRS = {"none": "as cut", "bridge": "bridged", "heal": "healed", "bridge+heal": "bridged and healed"}


def verdict_line(report: dict[str, Any]) -> str:
    """One line: the cut ``auto`` chose with its bound and its test result, or why nothing was cut."""
    search = report["search"]
    if search["winner"] is None:
        return str(search["message"])
    winner, test, depth = search["winner"], search["test"], report["cost"]["uncut"]["blocks"]
    repair = winner.get("repair", "none")
    kind = REPAIRS[repair] + (f", {winner['healing_steps']} healing steps" if winner["healing_steps"] else "")
    bound = winner["validation_drop"]["upper_bound_points"]
    confidence = search["rule"]["confidence"]
    how = f"upper {100 * confidence:g} % bound {bound:.2f}" if confidence else f"point estimate {bound:.2f}"
    return (f"cut to {winner['keep']} of {depth} blocks ({winner['strategy']}, {kind}): validation drop "
            f"{winner['validation_drop']['points']:.2f} points, {how} <= {search['max_drop']:g}; test drop "
            f"{points(test['points'], '.2f')} on {test['images']} images, scored once "
            f"({'within' if test['within_max_drop'] else 'beyond'} {search['max_drop']:g})")


def no_cut_line(report: dict[str, Any]) -> str | None:
    """For an ``auto`` run that certified no cut: one line that says no model was written and what would certify
    the nearest candidate (``search.to_certify``); None when a cut was made."""
    search = report.get("search")
    if not isinstance(search, dict) or search.get("winner") is not None:
        return None
    need = search.get("to_certify")
    if not need:
        return "no certified cut: no candidate was tested; no model written"
    how, images = REPAIRS[need["repair"]], need["validation_images"]
    nearest = f"no certified cut, no model written: the nearest candidate, {need['strategy']} keeping {need['keep']} "
    if need["max_drop"] is None:
        return (f"{nearest}blocks {how}, had an upper bound of {need['upper_bound_points']:.2f} points; with a "
                "--max-drop that large the search would repair it otherwise (its heal-image bound would qualify), "
                "so no --max-drop is promised")
    more = (f", or about {images:,} validation images at its observed rates ({search['validation_images']:,} now)"
            if images else " (at the present max drop no number of validation images certifies it as it was "
                           "tested)")
    return f"{nearest}blocks {how}, would be certified with --max-drop {need['max_drop']:.2f}{more}"


def report_table(report: dict[str, Any]) -> str:
    """The before/after table as text, with the kept blocks and the strategy (one row when nothing was cut)."""
    if report["cost"]["truncated"]["blocks"] == report["cost"]["uncut"]["blocks"]:
        return format_table(*report_rows(report)) + f"\nuncut model kept ({report['strategy']})"
    kept = ", ".join(map(str, report["kept_blocks"]))
    return f"{format_table(*report_rows(report))}\nkept blocks {kept} ({report['strategy']})"
