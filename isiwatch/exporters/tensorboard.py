"""TensorBoard: per-layer scalars, plateau summary, a custom-scalar layout, depth × step heat-maps, alerts.

Tags: ``isiwatch/<metric>/layer_<ll>``, ``isiwatch/plateau/{start,end,length}``,
``isiwatch/recommended_depth`` (blocks :func:`isiwatch.depth.recommend_depth` keeps), heat-map images
``isiwatch/heatmap/<metric>`` (rows = blocks, columns = samples, colour scaled to the metric's range over
the shown samples) and alert text under ``isiwatch/alerts``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..alerts import Alert
from ..sample import Sample

#: Pixels per heat-map cell (rows per block, columns per sample) so small models stay visible.
CELL_ROWS, CELL_COLS = 8, 4


def heatmap_image(grid: np.ndarray) -> np.ndarray:
    """(depth, samples) values → (3, H, W) uint8 viridis image; block 0 at the top, NaN in grey."""
    from matplotlib import colormaps

    finite = np.isfinite(grid)
    lo, hi = (grid[finite].min(), grid[finite].max()) if finite.any() else (0.0, 1.0)
    scaled = np.where(finite, (grid - lo) / (hi - lo if hi > lo else 1.0), 0.0)
    rgb = (colormaps["viridis"](scaled)[..., :3] * 255).astype(np.uint8)
    rgb[~finite] = 128
    rgb = rgb.repeat(CELL_ROWS, axis=0).repeat(CELL_COLS, axis=1)
    return rgb.transpose(2, 0, 1)


class TensorBoardExporter:
    """Writes through ``torch.utils.tensorboard.SummaryWriter``; heat-maps every ``heatmap_every`` samples."""

    def __init__(self, log_dir: str | Path, heatmap_every: int = 10):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(log_dir))
        self.heatmap_every = heatmap_every
        self._layout_written = False
        self._samples = 0

    def _write_layout(self, sample: Sample) -> None:
        charts = {m: ["Multiline", [f"isiwatch/{m}/layer_.*"]] for m in sample.layers}
        charts["plateau"] = ["Multiline", ["isiwatch/plateau/start", "isiwatch/plateau/end"]]
        if sample.recommendation is not None:
            charts["recommended_depth"] = ["Multiline", ["isiwatch/recommended_depth"]]
        self.writer.add_custom_scalars({"isiwatch": charts})
        self._layout_written = True

    def write_sample(self, sample: Sample, history: Sequence[Sample]) -> None:
        if not self._layout_written:
            self._write_layout(sample)
        for name, value in sample.series().items():
            if name.startswith("plateau/") and not math.isfinite(value):
                continue
            self.writer.add_scalar(f"isiwatch/{name}", value, sample.step, walltime=sample.time)
        self.writer.add_scalar("isiwatch/sample_duration_seconds", sample.duration_s, sample.step)
        self._samples += 1
        if self._samples % self.heatmap_every == 0:
            self.write_heatmaps(history)
        self.writer.flush()

    def write_heatmaps(self, history: Sequence[Sample]) -> None:
        if not history:
            return
        last = history[-1]
        for metric in last.layers:
            rows = [s.layers.get(metric, [math.nan] * last.depth) for s in history if s.depth == last.depth]
            grid = np.asarray(rows, dtype=float).T
            self.writer.add_image(f"isiwatch/heatmap/{metric}", heatmap_image(grid), last.step)

    def write_alert(self, alert: Alert) -> None:
        self.writer.add_text("isiwatch/alerts", f"**{alert.kind}** ({alert.severity}): {alert.message}",
                             alert.step, walltime=alert.time)
        self.writer.flush()

    def close(self, history: Sequence[Sample] = ()) -> None:
        self.write_heatmaps(history)
        self.writer.close()
