"""Offline analysis of a checkpoint: load safely, pick probe images, analyse, write outputs atomically."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._utils.files import atomic_files, write_json
from ..io.checkpoint import load_checkpoint
from ..io.models import build_model
from ..io.pretrained_dir import load_pretrained_dir
from ..io.timm_data import DEFAULT_WORKERS, probe_images, resolve_data_config
from ..measure.analysis import METRICS, Analysis, analyze
from ..measure.depth import recommend_depth
from ..measure.plots import plot_curves


def analysis_record(analysis: Analysis) -> dict[str, Any]:
    """The ``analysis.json`` content: [`Analysis.to_dict`][isiwatch.Analysis.to_dict] plus ``recommendation``, the depth
    [`recommend_depth`][isiwatch.recommend_depth] reads from the curves (``Analysis.from_dict`` ignores it)."""
    return {**analysis.to_dict(), "recommendation": recommend_depth(analysis).to_dict()}


def analyze_checkpoint(
    checkpoint: str | Path,
    *,
    arch: str | None = None,
    num_heads: int | None = None,
    data: str = "mnist",
    images: int = 1000,
    out: str | Path | None = None,
    metric: str = "token_similarity",
    with_isi_recon: bool = False,
    batch_size: int = 1000,
    prefer_ema: bool = True,
    mean: tuple[float, ...] | None = None,
    std: tuple[float, ...] | None = None,
    device: str = "cpu",
    echo: Callable[[str], None] | None = None,
    workers: int = DEFAULT_WORKERS,
) -> tuple[Analysis, list[Path]]:
    """Analyse a checkpoint; with ``out``, write ``analysis.json`` and ``curves.png`` there (`write_analysis`).

    ``arch`` and ``num_heads`` resolve checkpoints that do not record them (`load_checkpoint`). When
    ``data`` holds fewer than ``images`` images, all of them are used, the model info records that count and
    ``echo`` (if given) receives a one-line note saying so. Images are preprocessed as timm's ``validate.py`` would
    for this checkpoint (`resolve_data_config`; ``mean``/``std`` override the
    normalisation), read by ``workers`` DataLoader processes; the model info records the preprocessing and which
    weights were read (EMA or not).
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    if Path(checkpoint).is_dir():
        model, data_config, info = load_pretrained_dir(checkpoint)
    else:
        ckpt = load_checkpoint(checkpoint, arch=arch, prefer_ema=prefer_ema, num_heads=num_heads)
        model, data_config = build_model(ckpt), ckpt.data_config
        info = {"arch": ckpt.arch, "model_kwargs": ckpt.model_kwargs, "checkpoint": str(ckpt.path),
                "sha256": ckpt.sha256, "weights": ckpt.weights}
    model = model.to(device)
    norm = resolve_data_config(model, data, data_config, mean, std)
    x, y = probe_images(model, data, images, norm, workers)
    if len(x) < images and echo is not None:
        echo(f"note: --images {images} requested but {data} has only {len(x)}; analysed {len(x)} images")
    result = analyze(model, x, y, batch_size=batch_size, with_isi_recon=with_isi_recon, phase_metric=metric)
    if metric not in result.layers:
        raise ValueError(f"metric {metric!r} is not available for this model")
    result.model_info.update({**info, "data": data,
                         "normalization": norm.to_dict(), "images": len(x),
                         "parameters": sum(p.numel() for p in model.parameters())})
    return result, (write_analysis(result, out) if out is not None else [])


def write_analysis(result: Analysis, out: str | Path) -> list[Path]:
    """Write ``analysis.json`` and ``curves.png`` to ``out`` together (`atomic_files`).

    Both are staged first and moved into place only when both were written, ``analysis.json`` last: a failure,
    full disk or kill while writing never leaves one without the other, and a new ``analysis.json`` means its
    ``curves.png`` is new too.
    """
    out = Path(out)
    with atomic_files(out, last=("analysis.json",)) as stage:
        plot_curves(result, stage / "curves.png")
        write_json(stage / "analysis.json", analysis_record(result))
    return [out / "analysis.json", out / "curves.png"]

