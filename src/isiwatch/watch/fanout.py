"""The fan-out: where a Watch's samples and alert records go, the exporters in order and the user's
``alert_callback``; each call runs under the fault log's guard (`isiwatch.watch.faults`), so one that raises is
reported and skipped."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._utils.files import reserve_std_fds
from .alerts import Alert, AlertEngine, AlertSink, log_sink
from .config import WatchOptions
from .exporters import Exporter, JsonlExporter, PrometheusExporter, TensorBoardExporter
from .faults import FaultLog
from .log_folder import FolderInUse, LogFolderLock

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

#: The fault source of the user's ``alert_callback``.
CALLBACK = "alert_callback"


def folder_exporters(run_dir: Path, run: str, heatmap_every: int, lock: LogFolderLock | None = None
                     ) -> list[Exporter]:
    """The exporters that write the run's folder, JSONL then TensorBoard, under one lock (``lock``, or one taken
    now): refused when another Watch writes there (`FolderInUse`), and neither writes there while another run holds
    it."""
    lock = lock or LogFolderLock(run_dir, run)
    return [JsonlExporter(run_dir, run, lock), TensorBoardExporter(run_dir, heatmap_every, lock)]


def build_exporters(opts: WatchOptions, run: str, run_dir: Path | None, registry: CollectorRegistry | None,
                    exporters: Sequence[Exporter]) -> tuple[list[Exporter], PrometheusExporter | None]:
    """Rank 0's exporters, in call order: the built-in ones the options ask for (JSONL and TensorBoard in the run's
    folder ``run_dir``, Prometheus), then ``exporters``; and the built-in Prometheus exporter, if any."""
    reserve_std_fds()  # before any exporter opens a file or a socket
    built = folder_exporters(run_dir, run, opts.heatmap_every) if run_dir is not None else []
    prometheus = None
    if registry is not None or opts.prometheus_port is not None or opts.pushgateway or opts.textfile:
        prometheus = PrometheusExporter(run, registry, opts.prometheus_port, opts.prometheus_host, opts.pushgateway,
                                        opts.textfile)
        built.append(prometheus)
    return built + list(exporters), prometheus


class Fanout:
    """The Watch's outputs: its alert engine, whose sinks get every record in call order (the records of the sample
    in progress, the log, the exporters, ``alert_callback``), its fault log, and the exporters' hooks, each call
    under the fault log's guard.

    Args:
        run: The run's name.
        exporters: The Watch's exporters now (read at each call: the Watch empties them when it closes).
        options: The Watch's options (``strict``: re-raise an exporter's failure instead).
        step: The step a failing exporter's record names (the Watch's last sample).
        alert_callback: The user's callable that gets every alert record, or None.
        echo: Whether the fault log prints its records on stderr (rank 0 speaks for the job).
    """

    def __init__(self, run: str, exporters: Callable[[], list[Exporter]], options: WatchOptions,
                 step: Callable[[], int], alert_callback: AlertSink | None, echo: bool):
        self._exporters, self.options, self.step, self.alert_callback = exporters, options, step, alert_callback
        self._emitted: list[Alert] = []  # the records dispatched while collecting
        callback = [self.call_back] if alert_callback is not None else []
        self.alerts = AlertEngine(run, [self._emitted.append, log_sink, self.write_alert, *callback])
        self.faults = FaultLog(self.alerts, echo=echo)

    @contextlib.contextmanager
    def collecting(self) -> Iterator[list[Alert]]:
        """The records dispatched inside the block (a sample's), in order; the list is emptied on the way out."""
        self._emitted.clear()
        try:
            yield self._emitted
        finally:
            self._emitted.clear()

    def each(self, hook: str, *args: Any, among: Sequence[Exporter] | None = None) -> list[Any]:
        """Call ``hook`` (an [`Exporter`][isiwatch.Exporter] method) on every exporter (``among``: on those only),
        in order, and return what the calls that worked returned. One that raises is reported (`faults`) and
        skipped; the next call tries it again, and its next ``write_sample`` that works closes the fault."""
        exporters = list(self._exporters() if among is None else among)
        names = [type(exporter).__name__ for exporter in exporters]
        results = []
        if exporters:
            reserve_std_fds()  # stderr may have been closed since the last call; an exporter may open a file now
        for i, exporter in enumerate(exporters):
            source = f"exporter {names[i]}" if names.count(names[i]) == 1 else f"exporter {names[i]}[{i}]"
            in_use = f"{source} (run folder in use)"  # its own episode: said even while the exporter already fails
            with self.faults.guard(source, self.step(), strict=self.options.strict, recover=hook == "write_sample",
                                   sources_by_type={FolderInUse: in_use}):
                results.append(getattr(exporter, hook)(*args))
        return results

    def background_seconds(self) -> float:
        """The exporters' CPU seconds off the training thread since the last call (one that raises counts none)."""
        return sum(float(seconds) for seconds in self.each("background_seconds"))

    def write_alert(self, alert: Alert) -> None:
        self.each("write_alert", alert)

    def call_back(self, alert: Alert) -> None:
        """Hand ``alert`` to the user's ``alert_callback``; one that raises is reported like every other failing
        part (`faults`, source ``alert_callback``), and the next record of another source it takes closes
        that episode."""
        assert self.alert_callback is not None
        with self.faults.guard(CALLBACK, alert.step, recover=alert.data.get("source") != CALLBACK):
            self.alert_callback(alert)
