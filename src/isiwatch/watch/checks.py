"""The checks of a Watch's arguments, made when it is built and without a forward pass: a mistake is a
``ValueError`` (or ``TypeError``) then, not a failure at the first sample, which may be hours into training."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Set
from pathlib import Path

from torch import Tensor, nn

from .._utils.files import shown_path
from ..measure.analysis import METRICS, tracked_metrics, untracked_reason
from ..taps import ViTParts, input_problem
from .config import WatchOptions
from .exporters import Exporter
from .freezing import policy_of, wrapper_problem
from .sample import PLATEAU_SERIES, series_names


def check_arguments(model: nn.Module, inner: nn.Module, parts: ViTParts, images: object, labels: object,
                    opts: WatchOptions, exporters: Iterable[object]) -> frozenset[str]:
    """Check the probe batch, ``log_dir``, the freeze policy's wrapper (``model`` around ``inner``, the module the
    taps attach to), ``exporters`` and the names in ``phase_metric`` and ``monitor``, in that order. Returns every
    series a sample of this model can hold (what ``monitor`` may name)."""
    check_probe_batch(parts, images, labels, opts)
    if opts.run_folder is not None and not opts.log_dir:
        raise ValueError(f"run_folder {opts.run_folder!r} names a folder under log_dir, but log_dir is not set")
    if opts.log_dir:
        check_log_dir(Path(opts.log_dir, opts.run_folder or "."))
    problem = wrapper_problem(model, inner) if policy_of(opts.freeze_settled) else None
    if problem:
        raise ValueError(problem)
    check_exporters(exporters)
    metrics = tracked_metrics(parts.has_cls, labels is not None, opts.with_isi_recon)
    names = frozenset(series_names(metrics, parts.depth))
    check_series(opts, parts, labels is not None, names)
    return names


def check_probe_batch(parts: ViTParts, images: object, labels: object, opts: WatchOptions) -> None:
    """The probe batch fits the model and the options."""
    if not isinstance(images, Tensor) or images.dim() != 4 or len(images) < 4:
        shape = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
        raise ValueError(f"probe_images must be a (B,C,H,W) tensor with B >= 4, got {shape}")
    problem = input_problem(parts, images.shape)
    if problem:
        raise ValueError(f"probe_images do not fit the model: {problem}")
    n = len(images)
    if labels is not None:
        if not isinstance(labels, Tensor) or labels.dim() != 1:
            shape = tuple(labels.shape) if isinstance(labels, Tensor) else type(labels).__name__
            raise ValueError(f"probe_labels must be a 1-D tensor of class indices (B,), got {shape}")
        if len(labels) != n:
            raise ValueError(f"probe_labels has {len(labels)} labels for {n} probe images; give one per image")
    if opts.with_isi_recon:
        if parts.patch_embed is None:
            raise ValueError("with_isi_recon needs the patch embeddings, but this model exposes no patch embedding")
        last = n % opts.probe_batch_size or min(n, opts.probe_batch_size)
        if last < 4:
            raise ValueError(f"with_isi_recon needs at least 4 images in every probe chunk, but the smallest has "
                             f"{last} ({n} probe images in chunks of probe_batch_size={opts.probe_batch_size})")


def check_log_dir(log_dir: Path) -> None:
    """A ``log_dir`` that is a file, or lies under one, is a mistake refused now; a full or read-only disk is not
    (its exporters report it and try again at every write)."""
    for path in (log_dir, *log_dir.absolute().parents):
        if path.exists() and not path.is_dir():
            raise ValueError(f"log_dir {shown_path(log_dir)}: {shown_path(path)} is not a directory")


def check_exporters(exporters: Iterable[object]) -> None:
    """Every one of ``exporters`` is an [`Exporter`][isiwatch.Exporter]."""
    for exporter in exporters:
        if not isinstance(exporter, Exporter):
            raise TypeError(f"exporters must be isiwatch.watch.exporters.Exporter instances, got "
                            f"{type(exporter).__name__}")


def check_series(opts: WatchOptions, parts: ViTParts, probes: bool, series_names: Set[str]) -> None:
    """``phase_metric`` and ``monitor`` name curves this model's samples will have (``series_names``; ``probes``:
    the Watch has probe labels)."""
    reason = untracked_reason(opts.phase_metric, parts.has_cls, probes, opts.with_isi_recon)
    if reason:
        raise ValueError(f"phase_metric {opts.phase_metric!r} cannot be tracked: {reason}")
    if not opts.monitor or opts.monitor in series_names:
        return
    metric, _, part = opts.monitor.partition("/")
    reason = untracked_reason(metric, parts.has_cls, probes, opts.with_isi_recon) if part else None
    if reason and metric in METRICS:
        hint = reason
    else:
        close = difflib.get_close_matches(opts.monitor, sorted(series_names), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        hint += (f"series are <metric>/layer_00…layer_{parts.depth - 1:02d}, <metric>/last and <metric>/mean "
                 f"for {', '.join(m for m in METRICS if f'{m}/last' in series_names)}; "
                 f"{', '.join(PLATEAU_SERIES)}, recommended_depth and loss")
    raise ValueError(f"monitor {opts.monitor!r} is not a tracked series: {hint}")
