"""One sampling step of the monitor: the per-layer curves, phases and loss at a training step."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .._utils.files import finite_or_none
from ..measure.depth import DepthRecommendation
from ..measure.phases import Phases

#: The plateau series every sample holds.
PLATEAU_SERIES = ("plateau/detected", "plateau/start", "plateau/end", "plateau/length")
#: The Watch's own cost (`Sample.overhead_s`, `Sample.overhead_ratio`), when measured.
OVERHEAD_SERIES = ("overhead/seconds", "overhead/ratio")


def series_names(metrics: Iterable[str], depth: int) -> set[str]:
    """Every name `Sample.series` can hold for samples with per-layer ``metrics`` over ``depth`` blocks
    (``loss`` included: it is there whenever the caller passes a loss)."""
    per_metric = ("last", "mean", *(f"layer_{i:02d}" for i in range(depth)))
    return {f"{m}/{s}" for m in metrics for s in per_metric} | {*PLATEAU_SERIES, *OVERHEAD_SERIES,
                                                                "recommended_depth", "loss"}


@dataclass
class Sample:
    """Per-layer curves at training ``step``; ``duration_s`` is the probe pass + metrics wall time;
    ``recommendation`` the depth [`recommend_depth`][isiwatch.recommend_depth] reads from these curves.

    ``overhead_s`` is the Watch's wall time charged to this sample, in seconds: its probe pass and metrics plus
    what the previous sample did after its own (alert rules, stopping, exports) and the CPU time of the exporters'
    background work since (heat-map renders), so every second the Watch takes is counted once. ``overhead_ratio``
    is ``overhead_s`` over the training wall time since the previous sample ended, stretched to a full sampling
    interval at that pace when the sample came fewer steps after the previous one (the closing sample): the cost
    of sampling at the Watch's interval (None at the first sample of a process, which has no previous one).

    ``held_out`` is `Analysis.held_out`: which held-out probe images each probe classifies correctly, per block
    (empty without probes; not in the records). ``depth_evidence`` is the paired test behind the published
    ``recommendation`` (`isiwatch.watch.published_depth`), None before the Watch published one."""

    step: int
    time: float
    layers: dict[str, list[float]]
    phases: Phases | None
    duration_s: float
    loss: float | None = None
    recommendation: DepthRecommendation | None = None
    overhead_s: float | None = None
    overhead_ratio: float | None = None
    held_out: dict[str, list[tuple[bool, ...] | None]] = field(default_factory=dict)
    depth_evidence: dict[str, Any] | None = None

    @property
    def depth(self) -> int:
        return len(next(iter(self.layers.values()))) if self.layers else 0

    def series(self) -> dict[str, float]:
        """Flat named series (see `_series`), built once per sample: the stopper, TensorBoard and the
        framework loggers all read it."""
        return self._series

    @functools.cached_property
    def _series(self) -> dict[str, float]:
        """Flat named series for early stopping and export: ``<metric>/layer_<ll>``, ``<metric>/last``,
        ``<metric>/mean``, ``plateau/{detected,start,end,length}``, ``recommended_depth``, ``loss`` and
        ``overhead/{seconds,ratio}``."""
        out: dict[str, float] = {}
        for metric, values in self.layers.items():
            for i, v in enumerate(values):
                out[f"{metric}/layer_{i:02d}"] = v
            out[f"{metric}/last"] = values[-1]
            out[f"{metric}/mean"] = sum(values) / len(values)
        ph = self.phases
        out["plateau/detected"] = float(ph is not None)
        out["plateau/start"] = float(ph.plateau[0]) if ph else math.nan
        out["plateau/end"] = float(ph.plateau[1]) if ph else math.nan
        out["plateau/length"] = float(ph.length) if ph else 0.0
        if self.recommendation is not None:
            out["recommended_depth"] = float(self.recommendation.depth)
        if self.loss is not None:
            out["loss"] = self.loss
        if self.overhead_s is not None:
            out["overhead/seconds"] = self.overhead_s
        if self.overhead_ratio is not None:
            out["overhead/ratio"] = self.overhead_ratio
        return out

    def last_layer_accuracy(self) -> float | None:
        """The last block's probe accuracy ([CLS] when the model has one, else mean-pooled patches)."""
        for metric in ("probe_cls", "probe_patch_mean"):
            if metric in self.layers:
                return self.layers[metric][-1]
        return None

    def to_dict(self, run: str) -> dict[str, Any]:
        return {"step": self.step, "time": self.time, "run": run, "loss": finite_or_none(self.loss),
                "duration_s": self.duration_s, "overhead_s": self.overhead_s, "overhead_ratio": self.overhead_ratio,
                "layers": {m: [finite_or_none(v) for v in vals] for m, vals in self.layers.items()},
                "phases": self.phases.to_dict() if self.phases else None,
                "recommendation": self.recommendation.to_dict() if self.recommendation else None,
                "depth_evidence": self.depth_evidence}
