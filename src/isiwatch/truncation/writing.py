"""The last stage of ``truncate``: `write` writes the healed model and the report (JSON or an HTML page, as its
extension says), each when asked for, from process 0 only, atomically and only after everything else succeeded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import timm

from .._utils.files import atomic_write, write_json
from ..io.checkpoint import save_checkpoint
from ..io.pretrained_dir import save_pretrained_dir
from .execution import Execution
from .options import report_format
from .plan import TruncationPlan
from .record import certified, cut_model_kwargs
from .report_html import truncation_page

__all__ = ["write"]


def write(plan: TruncationPlan, execution: Execution, result: dict[str, Any]) -> list[Path]:
    """Write the healed model (`_write_model`) and the report (``result``), each when requested, from process 0
    only; returns the written paths. A run that certified no cut writes its report (the record of the decision) but
    no model (a copy of the input would pass for a cut)."""
    r = plan.request
    if not plan.fabric.is_global_zero:  # every process healed the same weights; one writes them
        return []
    paths = []
    if r.out is not None and certified(result):
        paths.append(_write_model(plan, execution, result, r.out))
    if r.report is not None:
        paths.append(_write_report(r.report, result))
    return paths


def _write_report(path: Path, result: dict[str, Any]) -> Path:
    """The report in the format ``path``'s extension names (`report_format`): JSON, or a self-contained HTML page of
    the truncation (`truncation_page`, the Truncation section of ``isiwatch report``'s page on its own)."""
    if report_format(path) == ".json":
        return write_json(path, result)
    as_read = json.loads(json.dumps(result))  # as isiwatch report reads it back from truncate_report.json
    with atomic_write(path) as fh:
        fh.write(truncation_page(as_read).encode("utf-8"))
    return path


def _write_model(plan: TruncationPlan, execution: Execution, result: dict[str, Any], out: Path) -> Path:
    """The healed model with its provenance metadata: a new ``save_pretrained`` directory for a Hugging Face
    source, else a timm checkpoint, checked first to load strictly into ``timm.create_model``."""
    r, ckpt = plan.request, plan.checkpoint
    metadata = {"kept_blocks": execution.kept, "source_sha256": ckpt.sha256, "source_checkpoint": str(ckpt.path),
                "source_depth": plan.depth, **{k: result[k] for k in ("strategy", "metric", "phases", "train_last",
                                                                        "epochs", "distill", "accuracy", "weights",
                                                                        "normalization", "data")},
                **({"class_map": plan.split.labels["classes"]} if plan.split.labels else {})}
    if ckpt.path.is_dir():
        return save_pretrained_dir(execution.model, out, metadata)
    model_kwargs = cut_model_kwargs(plan, execution)
    state = {k: v.detach().cpu() for k, v in execution.model.state_dict().items()}
    timm.create_model(ckpt.arch, pretrained=False, **model_kwargs).load_state_dict(state, strict=True)
    return save_checkpoint(out, ckpt.arch, model_kwargs, state, metadata, fmt=r.fmt)
