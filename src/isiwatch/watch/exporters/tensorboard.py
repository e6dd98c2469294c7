"""TensorBoard: per-layer scalars, plateau summary, a custom-scalar layout, depth × step heat-maps, alerts.

Tags: ``isiwatch/<metric>/layer_<ll>``, ``isiwatch/plateau/{start,end,length}``,
``isiwatch/recommended_depth`` (blocks [`recommend_depth`][isiwatch.recommend_depth] keeps),
``isiwatch/overhead/{seconds,ratio}`` (the Watch's own cost), ``isiwatch/sample_duration_seconds`` (the probe
pass and metrics alone, `Sample.duration_s`), heat-map images ``isiwatch/heatmap/<metric>``
(`isiwatch.measure.plots.heatmap_figure`: blocks × training step over the kept history, colour scaled to the
metric's range over the shown samples; every render redraws the exporter's one
`HeatmapPanel`) and alert text under ``isiwatch/alerts``.

Heat-maps are rendered on a background thread (a render of a long history takes longer than a probe pass), and
written by the next sample; the close renders the final history once more (training is over by then). The render
must not take the training's cores: one runs at a time, at the lowest scheduling priority (nice 19, Linux), and it
pauses after each metric's figure for `RENDER_PAUSE` times that figure's drawing time, so that it holds
Python's interpreter lock, which the training thread takes back after every torch call, for at most a fifth of
the time. Its CPU time is reported through
[`TensorBoardExporter.background_seconds`][isiwatch.TensorBoardExporter.background_seconds], and the Watch charges it to
the next sample's overhead.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...measure.plots import HeatmapPanel
from ...measure.vocabulary import alert_words, legend
from ..alerts import Alert
from ..faults import import_cleanly
from ..log_folder import LogFolderLock
from ..sample import Sample
from .base import Exporter, SampleContext, present_series

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

#: The modules a heat-map render draws with (`heatmap_images`, `isiwatch.measure.plots.heatmap_figure`).
HEATMAP_MODULES = ("matplotlib.figure", "matplotlib.ticker", "matplotlib.backends.backend_agg")
#: Seconds the render thread sleeps after each heat-map, per second spent drawing it: 4 keeps it off the interpreter
#: lock four fifths of the time.
RENDER_PAUSE = 4.0
#: The render thread's nice value (the lowest priority).
RENDER_NICE = 19


def alert_text(alert: Alert) -> str:
    """An alert record as TensorBoard's text (Markdown): kind, severity and message, its hint, then what the kind
    means."""
    hint = f"\n\nhint: {alert.hint}" if alert.hint else ""
    return f"**{alert.kind}** ({alert.severity}): {alert.message}{hint}\n\n{legend(alert_words(alert.kind))}".rstrip()


class _QuietWriterThreads:
    """A ``threading.excepthook`` in front of ``previous`` that drops the exceptions of the live exporters' writer
    threads and hands every other thread's on. Tensorboard's writer thread keeps its failure (a full disk, a
    vanished folder) and raises it on the next write, on the training thread, where the Watch reports it in one
    line; the traceback the thread would print on its way out is a second, unreported copy."""

    def __init__(self, previous: Callable[[threading.ExceptHookArgs], object]):
        self.previous = previous

    def __call__(self, args: threading.ExceptHookArgs) -> None:
        if args.thread is None or _writer_folder(args.thread) not in {os.path.normpath(e.log_dir) for e in _LIVE}:
            self.previous(args)


def _writer_folder(thread: threading.Thread) -> str | None:
    """The folder of the event file ``thread`` writes, when it is tensorboard's writer thread (its record writer's
    file), else None."""
    record_writer = getattr(thread, "_record_writer", None)
    filename = getattr(getattr(record_writer, "_writer", None), "filename", None)
    return os.path.normpath(os.path.dirname(os.fsdecode(filename))) if isinstance(filename, (str, bytes)) else None


#: The exporters whose writer threads `_QuietWriterThreads` silences.
_LIVE: weakref.WeakSet[TensorBoardExporter] = weakref.WeakSet()


def _quiet_writer_threads() -> None:
    """Put `_QuietWriterThreads` in front of the current ``threading.excepthook``, unless it is there."""
    if not isinstance(threading.excepthook, _QuietWriterThreads):
        threading.excepthook = _QuietWriterThreads(threading.excepthook)


class TensorBoardExporter(Exporter):
    """Writes through ``torch.utils.tensorboard.SummaryWriter``; heat-maps every ``heatmap_every`` samples (a
    render still running when the next is due is left to finish, and that one skipped).

    Args:
        log_dir: The folder of the event files.
        heatmap_every: Samples between two heat-map writes (the close writes them once more).
        lock: The folder's lock (the Watch's JSONL exporter shares it): every event file is opened under it, so a
            run refused the folder writes no event there; the close releases it. None: the folder is not locked.
    """

    def __init__(self, log_dir: str | Path, heatmap_every: int = 10, lock: LogFolderLock | None = None):
        self.log_dir = str(log_dir)
        self.lock = lock
        self.heatmap_every = heatmap_every
        self._writer: SummaryWriter | None = None
        self._layout_written = False
        self._samples = 0
        self._render: threading.Thread | None = None
        #: step and RGB image per metric of the last render, or what it raised
        self._rendered: tuple[int, dict[str, np.ndarray]] | Exception | None = None
        self._failed_render: Exception | None = None  # raised on the training thread by _raise_failed_render
        self._render_cpu_s = 0.0  # the render thread's CPU seconds not yet reported by background_seconds()
        self._hurry = threading.Event()  # set: the render in flight stops pausing (someone waits for it)
        self._written_step: int | None = None  # the step of the last heat-maps written
        self._panel = HeatmapPanel()  # drawn by one render at a time: the render thread's, then the close's

    def open(self) -> None:
        """Open the event file and import what the heat-maps draw with, now: a log_dir that cannot hold an event
        file is reported at once, and a render on the background thread never imports (an import that fails
        there is retried cleanly, `import_cleanly`)."""
        self.writer  # noqa: B018
        import_cleanly(*HEATMAP_MODULES)

    @property
    def writer(self) -> SummaryWriter:
        """The open writer; a new one (a new event file in ``log_dir``, under the folder's lock) after a write
        failed."""
        if self._writer is None:
            if self.lock is not None:
                self.lock.claim()  # raises FolderInUse while another run holds the folder
            import_cleanly("torch.utils.tensorboard")
            from torch.utils.tensorboard import SummaryWriter

            _LIVE.add(self)
            _quiet_writer_threads()  # each time: another hook may have been put in front since
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

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """A write to the event file: one that fails drops the writer (`_drop_writer`) before the failure is
        raised, so the next write opens a new one."""
        try:
            yield
        except Exception:
            self._drop_writer()
            raise

    def write_sample(self, sample: Sample, context: SampleContext) -> None:
        with self._writing():
            self._write_sample(sample, context)
        self._raise_failed_render()  # after the sample is written: the writer is sound

    def _write_sample(self, sample: Sample, context: SampleContext) -> None:
        if not self._layout_written:
            self._write_layout(sample)
        for name, value in present_series(sample).items():
            self.writer.add_scalar(f"isiwatch/{name}", value, sample.step, walltime=sample.time)
        self.writer.add_scalar("isiwatch/sample_duration_seconds", sample.duration_s, sample.step)
        self._write_rendered()
        self._samples += 1
        if self._samples % self.heatmap_every == 0 and self._render is None and context.history:
            self._hurry.clear()
            self._render = threading.Thread(target=self._render_heatmaps, args=(tuple(context.history),),
                                            name="isiwatch-heatmaps", daemon=True)
            self._render.start()
        self.writer.flush()

    def _render_heatmaps(self, history: Sequence[Sample]) -> None:
        """Render ``history``'s heat-maps into `_rendered`, on the render thread (the writer is left to the
        training thread), at the lowest priority and paced (see the module docstring); adds its CPU time to what
        [`background_seconds`][isiwatch.TensorBoardExporter.background_seconds] reports."""
        start = time.thread_time()
        if sys.platform == "linux":  # a thread id names this thread only on Linux (elsewhere it could be a process)
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), RENDER_NICE)
            except OSError:  # not permitted: render at the normal priority
                pass
        try:
            self._rendered = (history[-1].step, heatmap_images(history, self._panel, RENDER_PAUSE, self._hurry))
        except Exception as error:  # not a thread traceback: the training thread raises it where the Watch reports it
            self._rendered = error
        finally:
            self._render_cpu_s += time.thread_time() - start

    def background_seconds(self) -> float:
        """CPU seconds the heat-map renders that ended since the last call spent off the training thread (a render
        still running is counted once it ends; only the render thread adds to the count while it runs)."""
        if self._render is not None and self._render.is_alive():
            return 0.0
        seconds, self._render_cpu_s = self._render_cpu_s, 0.0
        return seconds

    def wait_for_heatmaps(self) -> None:
        """Wait for a heat-map render in flight, if any, and write it: for a reader of the event file mid-run
        (the close does it itself); raises what a background render raised since the last write."""
        self._write_rendered(wait=True)
        self._raise_failed_render()

    def _write_rendered(self, wait: bool = False) -> None:
        """Write the heat-maps of a finished render, if any (``wait``: of the one running, once it finishes)."""
        if self._render is None or (self._render.is_alive() and not wait):
            return
        self._hurry.set()
        self._render.join()
        self._render = None
        rendered, self._rendered = self._rendered, None
        if isinstance(rendered, Exception):
            self._failed_render = rendered
        elif rendered is not None:
            self._add_images(*rendered)

    def _raise_failed_render(self) -> None:
        """Raise a background render's failure on the caller's thread, once."""
        failure, self._failed_render = self._failed_render, None
        if failure is not None:
            raise failure

    def _add_images(self, step: int, images: dict[str, np.ndarray]) -> None:
        for metric, image in images.items():
            self.writer.add_image(f"isiwatch/heatmap/{metric}", image, step, dataformats="HWC")
        self._written_step = step

    def write_heatmaps(self, history: Sequence[Sample]) -> None:
        """Render and write ``history``'s heat-maps now, on the caller's thread, after any render still running
        (unless that one already showed ``history``'s last sample).

        Args:
            history: The samples to show, oldest first.
        """
        self.wait_for_heatmaps()
        if history and history[-1].step != self._written_step:
            self._add_images(history[-1].step, heatmap_images(history, self._panel))

    def resume(self, run: str, step: int) -> None:
        """Mark the restart in the event file: a ``SessionLog.START`` event at ``step + 1``, on which TensorBoard
        drops the events of this folder from that step on that earlier event files hold (the crashed run's)."""
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        with self._writing():
            event = Event(step=step + 1, wall_time=time.time(), session_log=SessionLog(status=SessionLog.START))
            self.writer._get_file_writer().add_event(event)  # type: ignore[no-untyped-call]
            self.writer.flush()

    def write_alert(self, alert: Alert) -> None:
        with self._writing():
            self.writer.add_text("isiwatch/alerts", alert_text(alert), alert.step, walltime=alert.time)
            self.writer.flush()

    def close(self, context: SampleContext) -> None:
        """Write the final heat-maps, then close the event file and release the folder's lock."""
        try:
            self.write_heatmaps(context.history)
        finally:
            writer, self._writer = self._writer, None
            if writer is not None:
                self._writer = writer
                self._drop_writer()
            if self.lock is not None:
                self.lock.release()


def heatmap_images(history: Sequence[Sample], panel: HeatmapPanel, pause: float = 0.0,
                   hurry: threading.Event | None = None) -> dict[str, np.ndarray]:
    """One RGB image (H, W, 3 uint8) per metric of the last sample: a `HeatmapPanel`
    over the samples of the last sample's depth, drawn with Agg (no pyplot, so any thread may call it).

    Args:
        history: The samples, oldest first (not empty); a sample without a metric (the probes under
            ``probe_every``) is a blank column.
        panel: The figure to redraw (one caller at a time).
        pause: Seconds to sleep after each image per second spent drawing it (0: none), so that a background
            render leaves the interpreter lock to the training thread most of the time.
        hurry: Once set, no more pauses (someone is waiting for the images).
    """
    import_cleanly(*HEATMAP_MODULES)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    last = history[-1]
    shown = [s for s in history if s.depth == last.depth]
    images = {}
    grids = {metric: [s.layers.get(metric, [math.nan] * last.depth) for s in shown] for metric in last.layers}
    begin = time.perf_counter()
    for metric, fig in panel.draw([s.step for s in shown], grids):
        canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
        canvas.draw()  # type: ignore[no-untyped-call]
        images[metric] = np.asarray(canvas.buffer_rgba())[..., :3].copy()  # type: ignore[no-untyped-call]
        if pause:
            seconds = pause * (time.perf_counter() - begin)
            if hurry is None:
                time.sleep(seconds)
            else:
                hurry.wait(seconds)
        begin = time.perf_counter()
    return images
