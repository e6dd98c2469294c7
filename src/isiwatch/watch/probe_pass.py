"""The probe pass: one forward of the model over the fixed probe batch, and the `Sample` computed from it.

The Watch's own forward passes run with autocast off (`own_numerics`), so a training loop that samples inside
``torch.autocast`` does not change their dtypes; an out-of-memory error is retried once in smaller chunks.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time

import torch
from torch import Tensor, nn

from ..measure.analysis import Analysis, analyze_batch
from ..measure.depth import recommend_depth
from ..measure.probe_batch import ProbeBatch
from ..measure.recon import DEFAULT_RECON_COMPONENTS
from ..taps import ViTParts
from .config import WatchOptions
from .freezing import Freezer
from .sample import Sample

logger = logging.getLogger("isiwatch")

#: The share of the probe images the linear probes train on (`analyze`'s default): the rest is held out.
PROBE_TRAIN_FRACTION = 0.7

#: The device types whose autocast `own_numerics` turns off (torch's autocast devices that isiwatch runs on).
_AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps")


def own_numerics(model: nn.Module) -> contextlib.ExitStack:
    """Autocast off, on the CPU and on every device the model lives on, for the Watch's own forward passes: a
    training loop that calls ``step()`` inside ``torch.autocast`` must not change the probe pass's dtypes (its taps
    compute in the model's own dtype, or under ``probe_dtype``'s autocast around the forward alone), and the
    caller's autocast state is back as it was on exit."""
    stack = contextlib.ExitStack()
    devices = {"cpu"} | {p.device.type for p in model.parameters() if p.device.type in _AUTOCAST_DEVICES}
    for device in sorted(devices):
        stack.enter_context(torch.autocast(device, enabled=False))
    return stack


def _free_memory() -> None:
    """Return what a failed probe pass allocated to the device (its tensors are garbage once its frames are)."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.empty_cache()


class ProbePass:
    """Measures the model on the probe batch.

    Args:
        model: The plain module the taps attach to (the Watch's model unwrapped).
        parts: Its adapter.
        probe_images: The probe batch (B,C,H,W).
        probe_labels: Its class indices (B,), or None (no linear probes).
        options: The Watch's options (``probe_batch_size``, ``with_isi_recon``, ``phase_metric``, ``min_layers``,
            ``probe_dtype``).
        freezer: The freeze policy, which records each block's output during the pass; None when it is off.
    """

    def __init__(self, model: nn.Module, parts: ViTParts, probe_images: Tensor, probe_labels: Tensor | None,
                 options: WatchOptions, freezer: Freezer | None):
        self.model, self.parts, self.options, self.freezer = model, parts, options, freezer
        # the probe split, label codes and device copies, fixed with the probe batch: made once, not per sample
        self.batch = ProbeBatch(probe_images, probe_labels, PROBE_TRAIN_FRACTION)

    def measure(self, step: int, loss: float | Tensor | None, probes: bool, loss_scale: float) -> Sample:
        """The sample at training ``step``: the probe pass and everything computed from it (the linear probes only
        when ``probes``), read on the host once together with the loss (times ``loss_scale``). An out-of-memory
        error frees what the pass held and retries once in chunks a quarter the size."""
        start = time.monotonic()
        extra = {"loss": loss.detach()} if isinstance(loss, Tensor) else {}
        chunk = self.options.probe_batch_size
        try:
            analysis, read = self._analyze(chunk, probes, extra)
        except torch.OutOfMemoryError:
            smaller = max(4 if self.options.with_isi_recon else 1, chunk // 4)
            if smaller >= chunk:
                raise
            analysis = None  # the retry runs outside the handler, so the failed pass's frames are released
        if analysis is None:
            _free_memory()
            logger.info("isiwatch: the probe pass ran out of memory; retrying in chunks of %d images", smaller)
            analysis, read = self._analyze(smaller, probes, extra)
        if loss is not None:
            loss = (read["loss"][0] if isinstance(loss, Tensor) else float(loss)) * loss_scale
        recommendation = recommend_depth(analysis)
        return Sample(step, time.time(), analysis.layers, analysis.phases, time.monotonic() - start, loss,
                      recommendation, held_out=analysis.held_out)

    def _analyze(self, batch_size: int, probes: bool, extra: dict[str, Tensor]
                 ) -> tuple[Analysis, dict[str, list[float]]]:
        opts = self.options
        options = {"batch_size": batch_size, "isi_recon": opts.with_isi_recon,
                   "recon_components": DEFAULT_RECON_COMPONENTS, "probe_train_fraction": PROBE_TRAIN_FRACTION,
                   "seed": 0}
        with self.freezer.recording() if self.freezer else contextlib.nullcontext():
            return analyze_batch(self.model, self.batch, options, probes=probes,
                                 phase_metric=opts.phase_metric, phase_options={"min_layers": opts.min_layers},
                                 parts=self.parts, extra=extra,
                                 forward_dtype=getattr(torch, opts.probe_dtype) if opts.probe_dtype else None)
