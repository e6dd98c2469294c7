"""The truncation report: what it measures (parameters, FLOPs, latency, held-out accuracy and agreement of the
uncut, cut and healed models) and how it reads as terminal tables. The HTML run report shows the same rows."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from ..io.checkpoint import Checkpoint
from ..measure.tables import format_table
from .classifier_layout import block_list
from .cost import count_parameters, forward_flops, measure_latency


def measure(ckpt: Checkpoint, uncut: nn.Module, model: nn.Module, images: Tensor, labels: Tensor,
            reference: Tensor, before: Tensor, after: Tensor) -> dict[str, Any]:
    """Costs (parameters, FLOPs per image, median latency of a batch) and held-out accuracies."""
    batch = images[:64].to(next(uncut.parameters()).device)
    latency = measure_latency({"uncut": uncut, "truncated": model}, batch)
    cost = {name: {"blocks": len(block_list(m)), "parameters": count_parameters(m),
                   "flops_per_image": forward_flops(m, batch[:1]), "latency_ms": latency[name]}
            for name, m in (("uncut", uncut), ("truncated", model))}
    return {"source": {"checkpoint": str(ckpt.path), "sha256": ckpt.sha256, "arch": ckpt.arch},
            "held_out_images": len(labels), "latency_batch": len(batch), "cost": cost,
            "accuracy": {name: float((p == labels).float().mean())
                         for name, p in (("uncut", reference), ("cut", before), ("healed", after))},
            "agreement": {name: float((p == reference).float().mean()) for name, p in (("cut", before),
                                                                                     ("healed", after))}}


def report_rows(report: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """Before/after header and rows: blocks, parameters, FLOPs, latency, held-out accuracy, agreement."""
    cost, acc, agree = report["cost"], report["accuracy"], report["agreement"]
    header = ["model", "blocks", "params", "MFLOPs/img", f"latency ms/{report['latency_batch']}", "accuracy",
              "agreement"]
    rows = []
    for name, kind in (("uncut", "uncut"), ("cut", "truncated"), ("healed", "truncated")):
        c = cost[kind]
        rows.append([name, c["blocks"], c["parameters"], c["flops_per_image"] / 1e6, c["latency_ms"], acc[name],
                     agree.get(name, 1.0)])
    return header, rows


def candidates_table(report: dict[str, Any]) -> str:
    """Every cut ``auto`` tried, with validation accuracies, costs and the winner marked."""
    search = report["search"]
    header = ["strategy", "blocks", "kept", "val cut", "val healed", "params", "MFLOPs/img",
              f"latency ms/{search['latency_batch']}", ""]
    rows = [[c["strategy"], c["keep"], ",".join(map(str, c["kept_blocks"])), c["validation_accuracy"]["cut"],
             c["validation_accuracy"]["healed"], c["parameters"], c["flops_per_image"] / 1e6, c["latency_ms"],
             "winner" if c["winner"] else ("ok" if c["qualifies"] else "")] for c in search["candidates"]]
    points = f"{search['max_drop']:g} point{'' if search['max_drop'] == 1 else 's'}"
    return (f"uncut validation accuracy {search['uncut_validation_accuracy']:.3f}; a cut qualifies within "
            f"{points}\n{format_table(header, rows)}")


def report_table(report: dict[str, Any]) -> str:
    """The before/after table as text, with the kept blocks and the strategy."""
    kept = ", ".join(map(str, report["kept_blocks"]))
    return f"{format_table(*report_rows(report))}\nkept blocks {kept} ({report['strategy']})"
