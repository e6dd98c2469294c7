"""TensorBoard: per-layer scalars, plateau summary, a custom-scalar layout, depth × step heat-maps, alerts.

Tags: ``isiwatch/<metric>/layer_<ll>``, ``isiwatch/plateau/{start,end,length}``,
``isiwatch/recommended_depth`` (blocks :func:`isiwatch.measure.depth.recommend_depth` keeps), heat-map images
``isiwatch/heatmap/<metric>`` (:func:`isiwatch.measure.plots.heatmap_figure`: blocks × training step over the kept
history, colour scaled to the metric's range over the shown samples) and alert text under ``isiwatch/alerts``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...measure.plots import heatmap_figure
from ..alerts import Alert
from ..sample import Sample
from .base import Exporter, SampleContext, present_series

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter


class TensorBoardExporter(Exporter):
    """Writes through ``torch.utils.tensorboard.SummaryWriter``; heat-maps every ``heatmap_every`` samples.

    Args:
        log_dir: The folder of the event files.
        heatmap_every: Samples between two heat-map writes (the close writes them once more).
    """

    def __init__(self, log_dir: str | Path, heatmap_every: int = 10):
        self.log_dir = str(log_dir)
        self.heatmap_every = heatmap_every
        self._writer: SummaryWriter | None = None
        self._layout_written = False
        self._samples = 0
        self.writer  # noqa: B018  (open the event file now: a log_dir that cannot hold one fails at construction)

    @property
    def writer(self) -> SummaryWriter:
        """The open writer; a new one (a new event file in ``log_dir``) after a write failed."""
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(self.log_dir)
            self._layout_written = False
        return self._writer

    def _drop_writer(self) -> None:
        """Release a writer that failed (a full disk, a vanished folder): once its background thread has failed
        it refuses every write, so the next write opens a new one. Its own close flushes first and can fail
        again; the event file is closed all the same."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        try:
            writer.close()
        except Exception:  # the flush before the close failed: close the file beneath it
            file_writers: list[Any] = list((writer.all_writers or {}).values())
            for file_writer in file_writers:
                try:
                    file_writer.event_writer._async_writer._writer.close()  # tensorboard's RecordWriter
                except Exception:
                    pass

    def _write_layout(self, sample: Sample) -> None:
        charts = {m: ["Multiline", [f"isiwatch/{m}/layer_.*"]] for m in sample.layers}
        charts["plateau"] = ["Multiline", ["isiwatch/plateau/start", "isiwatch/plateau/end"]]
        if sample.recommendation is not None:
            charts["recommended_depth"] = ["Multiline", ["isiwatch/recommended_depth"]]
        self.writer.add_custom_scalars({"isiwatch": charts})
        self._layout_written = True

    def write_sample(self, sample: Sample, context: SampleContext) -> None:
        try:
            self._write_sample(sample, context)
        except Exception:
            self._drop_writer()
            raise

    def _write_sample(self, sample: Sample, context: SampleContext) -> None:
        if not self._layout_written:
            self._write_layout(sample)
        for name, value in present_series(sample).items():
            self.writer.add_scalar(f"isiwatch/{name}", value, sample.step, walltime=sample.time)
        self.writer.add_scalar("isiwatch/sample_duration_seconds", sample.duration_s, sample.step)
        self._samples += 1
        if self._samples % self.heatmap_every == 0:
            self.write_heatmaps(context.history)
        self.writer.flush()

    def write_heatmaps(self, history: Sequence[Sample]) -> None:
        if not history:
            return
        last = history[-1]
        for metric in last.layers:
            shown = [s for s in history if s.depth == last.depth]
            rows = [s.layers.get(metric, [math.nan] * last.depth) for s in shown]
            figure = heatmap_figure([s.step for s in shown], {metric: rows})
            self.writer.add_figure(f"isiwatch/heatmap/{metric}", figure, last.step)

    def write_alert(self, alert: Alert) -> None:
        try:
            self.writer.add_text("isiwatch/alerts", f"**{alert.kind}** ({alert.severity}): {alert.message}",
                                 alert.step, walltime=alert.time)
            self.writer.flush()
        except Exception:
            self._drop_writer()
            raise

    def close(self, context: SampleContext) -> None:
        try:
            self.write_heatmaps(context.history)
        finally:
            writer, self._writer = self._writer, None
            if writer is not None:
                self._writer = writer
                self._drop_writer()
