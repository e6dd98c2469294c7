"""Prometheus export (namespace ``isiwatch``): an HTTP endpoint on 127.0.0.1 by default, a push gateway,
or a node-exporter textfile. Pushes run on a background thread with a deadline; a failed push or textfile write
is raised to the Watch, which reports it once and never lets it stop training (`isiwatch.watch.faults`)."""

from __future__ import annotations

import http.client
import math
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, push_to_gateway, start_http_server
from prometheus_client import write_to_textfile as _write_textfile
from prometheus_client.metrics_core import Metric

from ..alerts import ALERT_KINDS, Alert
from ..config import gateway_problem
from ..faults import warn
from ..sample import Sample
from .base import Exporter, SampleContext

#: The most seconds a push to the gateway may take, connection and whole response together (it runs off the
#: training thread either way); shorter when samples come faster (`push_deadline`).
PUSH_DEADLINE = 5.0
#: The least seconds a push is given, however fast samples come.
MIN_PUSH_DEADLINE = 1.0
#: Seconds ``close`` waits for the last push before it aborts it, and then for the thread to end: ``close``
#: returns within their sum, 2 s, whatever the gateway does.
CLOSE_WAIT = 1.5
ABORT_WAIT = 0.5

#: Every metric name the exporter publishes (rules and dashboards may only query these).
EXPORTED_NAMES = (
    "isiwatch_layer_metric", "isiwatch_plateau_detected", "isiwatch_plateau_start_layer",
    "isiwatch_plateau_end_layer", "isiwatch_plateau_length_layers", "isiwatch_plateau_onset_step",
    "isiwatch_plateau_onset_start_layer", "isiwatch_plateau_onset_end_layer", "isiwatch_alerts_total",
    "isiwatch_alert_active", "isiwatch_alert_start_step", "isiwatch_last_sample_timestamp_seconds",
    "isiwatch_sample_duration_seconds", "isiwatch_training_step", "isiwatch_training_loss",
    "isiwatch_stop_requested", "isiwatch_recommended_depth", "isiwatch_overhead_seconds", "isiwatch_overhead_ratio",
)


class PrometheusExporter(Exporter):
    """Gauges per layer and metric plus plateau, recommended-depth, alert and liveness series, labelled by
    ``run``.

    A value that does not exist is not published (the series is absent), never a sentinel such as -1: the
    plateau span while the sample has no plateau, the onset step and span while no ``plateau_onset``
    episode is open, an alert kind's start step while its episode is closed.

    Args:
        run: The ``run`` label.
        registry: The registry the metrics live in (a private one by default).
        port: Serve the registry over HTTP on this port (0: any free one; None: no server).
        host: The address the HTTP server binds.
        pushgateway: Push the registry to this gateway after every sample: ``host:port`` or an http(s) URL with a
            host, printable and without spaces (anything else raises ``ValueError`` here).
        textfile: Rewrite this node-exporter textfile after every sample.
        job: The push gateway's ``job``.
    """

    def __init__(self, run: str, registry: CollectorRegistry | None = None, port: int | None = None,
                 host: str = "127.0.0.1", pushgateway: str | None = None, textfile: str | Path | None = None,
                 job: str = "isiwatch"):
        if pushgateway is not None and (problem := gateway_problem(pushgateway)):
            raise ValueError(f"pushgateway {problem}")
        self.run = run
        self.registry = registry if registry is not None else CollectorRegistry()
        self.pushgateway, self.textfile, self.job = pushgateway, textfile, job
        self._pusher: _Pusher | None = None
        r, run_label = self.registry, ["run"]
        self.layer_metric = Gauge("isiwatch_layer_metric", "Per-layer diagnostic value",
                                  ["run", "layer", "metric"], registry=r)
        self.plateau_detected = Gauge("isiwatch_plateau_detected", "1 if the phase curve has a plateau",
                                      run_label, registry=r)
        self.plateau_start = Gauge("isiwatch_plateau_start_layer",
                                   "First block of the plateau in the last sample (absent: none)", run_label,
                                   registry=r)
        self.plateau_end = Gauge("isiwatch_plateau_end_layer",
                                 "Last block of the plateau in the last sample (absent: none)", run_label,
                                 registry=r)
        self.plateau_length = Gauge("isiwatch_plateau_length_layers", "Plateau length in blocks",
                                    run_label, registry=r)
        self.onset_step = Gauge("isiwatch_plateau_onset_step",
                                "Training step of plateau onset (absent: no plateau_onset episode open)",
                                run_label, registry=r)
        self.onset_start = Gauge("isiwatch_plateau_onset_start_layer",
                                 "First block of the plateau the open plateau_onset episode began with",
                                 run_label, registry=r)
        self.onset_end = Gauge("isiwatch_plateau_onset_end_layer",
                               "Last block of the plateau the open plateau_onset episode began with",
                               run_label, registry=r)
        self.alerts_total = Counter("isiwatch_alerts", "Alert records emitted", ["run", "kind"], registry=r)
        self.alert_active = Gauge("isiwatch_alert_active", "1 while an alert episode is open",
                                  ["run", "kind"], registry=r)
        self.alert_start = Gauge("isiwatch_alert_start_step", "Training step at which the open episode began",
                                 ["run", "kind"], registry=r)
        self.last_sample = Gauge("isiwatch_last_sample_timestamp_seconds", "Unix time of the last sample",
                                 run_label, registry=r)
        self.duration = Histogram("isiwatch_sample_duration_seconds", "Probe pass + metrics wall time",
                                  run_label, registry=r,
                                  buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.step = Gauge("isiwatch_training_step", "Training step of the last sample", run_label, registry=r)
        self.loss = Gauge("isiwatch_training_loss", "Training loss at the last sample", run_label, registry=r)
        self.stop = Gauge("isiwatch_stop_requested", "1 once isiwatch asked training to stop", run_label,
                          registry=r)
        self.recommended_depth = Gauge("isiwatch_recommended_depth",
                                       "Blocks the model needs (isiwatch.measure.depth.recommend_depth)", run_label,
                                       registry=r)
        self.overhead_seconds = Gauge("isiwatch_overhead_seconds",
                                      "The Watch's wall time charged to the last sample (its probe pass and metrics "
                                      "plus the previous sample's exports)", run_label, registry=r)
        self.overhead_ratio = Gauge("isiwatch_overhead_ratio",
                                    "isiwatch_overhead_seconds over the training wall time since the previous sample",
                                    run_label, registry=r)
        self.server = None
        if port is not None:
            try:
                self.server, _ = start_http_server(port, addr=host, registry=self.registry)
            except OSError as exc:
                warn(f"cannot serve Prometheus metrics on {host}:{port} ({exc.strerror or exc}); HTTP export is "
                     f"off, training continues")

    @property
    def port(self) -> int | None:
        return self.server.server_address[1] if self.server else None

    def write_sample(self, sample: Sample, context: SampleContext) -> None:
        opened = context.opened
        for metric, values in sample.layers.items():
            for i, v in enumerate(values):
                self.layer_metric.labels(self.run, f"{i:02d}", metric).set(v)
        ph = sample.phases
        self.plateau_detected.labels(self.run).set(int(ph is not None))
        _set(self.plateau_start, ph.plateau[0] if ph else None, self.run)
        _set(self.plateau_end, ph.plateau[1] if ph else None, self.run)
        self.plateau_length.labels(self.run).set(ph.length if ph else 0)
        _set(self.onset_step, context.onset_step, self.run)
        span = opened["plateau_onset"].data.get("plateau") if "plateau_onset" in opened else None
        _set(self.onset_start, span[0] if span else None, self.run)
        _set(self.onset_end, span[1] if span else None, self.run)
        for kind in ALERT_KINDS:
            self.alert_active.labels(self.run, kind).set(int(kind in context.active_alerts))
            _set(self.alert_start, opened[kind].step if kind in opened else None, self.run, kind)
        self.last_sample.labels(self.run).set(sample.time)
        self.duration.labels(self.run).observe(sample.duration_s)
        self.step.labels(self.run).set(sample.step)
        if sample.loss is not None and math.isfinite(sample.loss):
            self.loss.labels(self.run).set(sample.loss)
        self.stop.labels(self.run).set(int(context.stop_requested))
        if sample.recommendation is not None:
            self.recommended_depth.labels(self.run).set(sample.recommendation.depth)
        if sample.overhead_s is not None:
            self.overhead_seconds.labels(self.run).set(sample.overhead_s)
        if sample.overhead_ratio is not None:
            self.overhead_ratio.labels(self.run).set(sample.overhead_ratio)
        self.publish()

    def rename(self, run: str) -> None:
        """Publish under ``run`` from now on (a resumed run's name); the series already published under the old
        name are removed (each metric's ``remove``; other runs' series in a shared registry stay), so one run
        never shows as two."""
        if run == self.run:
            return
        self.remove_series()
        self.run = run

    def remove_series(self) -> None:
        """Remove every series this run published, and only those."""
        by_kind = (self.alerts_total, self.alert_active, self.alert_start)
        for metric in (self.layer_metric, *by_kind, self.plateau_detected, self.plateau_start, self.plateau_end,
                       self.plateau_length, self.onset_step, self.onset_start, self.onset_end, self.last_sample,
                       self.duration, self.step, self.loss, self.stop, self.recommended_depth, self.overhead_seconds,
                       self.overhead_ratio):
            names = ("run", "layer", "metric") if metric is self.layer_metric else (
                ("run", "kind") if metric in by_kind else ("run",))  # as declared above
            published = {tuple(s.labels[n] for n in names) for family in metric.collect() for s in family.samples
                         if s.labels.get("run") == self.run}
            for labels in published:
                metric.remove(*labels)

    def write_alert(self, alert: Alert) -> None:
        self.alerts_total.labels(self.run, alert.kind).inc()

    def publish(self) -> None:
        """Rewrite the textfile and hand this sample's values to the background pusher, if configured.

        A push never blocks training: the values are snapshotted here and pushed by a thread, with a deadline
        (`push_deadline`: at most `PUSH_DEADLINE` seconds, connection and whole response); a push that failed or
        ran past its deadline is raised at the next call (so the Watch reports it, and clears it once a push works
        again)."""
        if self.textfile:
            _write_textfile(str(self.textfile), self.registry)
        if self.pushgateway:
            if self._pusher is None:
                self._pusher = _Pusher(self.pushgateway, self.job)
            self._pusher.submit(_Snapshot(list(self.registry.collect())), {"run": self.run})
            error = self._pusher.error
            if error is not None:
                raise error

    def close(self, context: SampleContext | None = None) -> None:
        """Stop the HTTP server, if any (the registry keeps the last values), and the pusher: within 2 s
        (`CLOSE_WAIT` + `ABORT_WAIT`) whatever the gateway does; raise if the last push failed or was aborted.

        Args:
            context: Unused; optional so that a caller who kept the exporter past its Watch can close it.
        """
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        if self._pusher is not None:
            pusher, self._pusher = self._pusher, None
            pusher.close()


class _Snapshot:
    """A registry's metrics as collected at one moment: what a background push sends, whatever the training
    thread sets meanwhile."""

    def __init__(self, metrics: list[Metric]):
        self.metrics = metrics

    def collect(self) -> list[Metric]:
        return self.metrics


class _Pusher:
    """Pushes snapshots to a push gateway from a daemon thread, newest first: a snapshot still waiting when a
    newer one arrives is replaced, so a slow or silent gateway costs the training loop nothing. ``error`` is
    the last push's failure, None once a push works.

    Every push has a deadline for the connection and the whole response together (`push_deadline`): a gateway
    that holds the connection or trickles its answer byte by byte fails that push at the deadline (its socket is
    shut down), and the next push opens a new connection."""

    def __init__(self, gateway: str, job: str):
        self.gateway, self.job = gateway, job
        self.error: Exception | None = None
        self._lock = threading.Condition()
        self._pending: tuple[_Snapshot, dict[str, str], float] | None = None
        self._closing = False
        self._aborted = False  # close() gave up: no further request starts
        self._request: _Request | None = None  # the push in flight
        self._last_submit: float | None = None
        self._thread = threading.Thread(target=self._run, name="isiwatch-pushgateway", daemon=True)
        self._thread.start()

    def submit(self, snapshot: _Snapshot, grouping_key: dict[str, str]) -> None:
        """Queue ``snapshot`` (replacing one not yet pushed), with `push_deadline` of the time since the last
        submit, the sampling interval."""
        now = time.monotonic()
        interval = None if self._last_submit is None else now - self._last_submit
        self._last_submit = now
        with self._lock:
            self._pending = (snapshot, grouping_key, push_deadline(interval))
            self._lock.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._pending is not None or self._closing)
                if self._pending is None:
                    return
                (snapshot, grouping_key, deadline), self._pending = self._pending, None
            try:
                push_to_gateway(self.gateway, job=self.job, registry=snapshot, grouping_key=grouping_key,
                                timeout=deadline, handler=self._handler(deadline))
                self.error = None
            except Exception as exc:  # any failure: refused, HTTP 500, not HTTP at all, the deadline
                self.error = exc

    def _handler(self, deadline: float) -> Callable[..., Callable[[], None]]:
        """A prometheus_client push handler that sends the request through a `_Request` with ``deadline``."""
        def handler(url: str, method: str, timeout: float | None, headers: list[tuple[str, str]],
                    data: bytes) -> Callable[[], None]:  # prometheus_client passes these by name
            def send() -> None:
                request = _Request(url, deadline)
                with self._lock:
                    if self._aborted:
                        raise TimeoutError("close() aborted the push")
                    self._request = request
                try:
                    request.send(method, headers, data)
                finally:
                    with self._lock:
                        self._request = None
            return send
        return handler

    def close(self) -> None:
        """Push what is pending if the gateway answers within `CLOSE_WAIT` seconds, then stop: a push still in
        flight then is aborted, so ``close`` returns within `CLOSE_WAIT` + `ABORT_WAIT` seconds whatever the
        gateway does. Raise the last push's failure, or ``TimeoutError`` when it had to be aborted (the final
        sample never reached the gateway, and the Watch reports that like any failed push)."""
        with self._lock:
            self._closing = True
            self._lock.notify()
        self._thread.join(CLOSE_WAIT)
        if self._thread.is_alive():
            with self._lock:
                self._pending, self._aborted = None, True
                if self._request is not None:
                    self._request.abort()
            self._thread.join(ABORT_WAIT)
            raise TimeoutError(f"the push gateway did not take the last sample within {CLOSE_WAIT:.1f} s of close()")
        if self.error is not None:
            raise self.error


def push_deadline(interval: float | None) -> float:
    """Seconds a push may take: `PUSH_DEADLINE`, or the sampling interval ``interval`` (seconds between two
    samples) when that is shorter, but never under `MIN_PUSH_DEADLINE`."""
    limit = PUSH_DEADLINE if interval is None or not math.isfinite(interval) else min(PUSH_DEADLINE, interval)
    return max(MIN_PUSH_DEADLINE, limit)


class _Request:
    """One HTTP request with a deadline on the connection and the whole response: a timer shuts the socket down
    at the deadline, which ends any read in progress, however slowly the server sends."""

    def __init__(self, url: str, deadline: float):
        parts = urllib.parse.urlsplit(url)
        connection = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        self.deadline = deadline
        self.path = parts.path + (f"?{parts.query}" if parts.query else "")
        self.connection = connection(parts.hostname or "", parts.port, timeout=deadline)
        self.expired = False

    def abort(self) -> None:
        """End the request now: shut its socket down (a read in progress returns at once)."""
        self.expired = True
        sock = self.connection.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed
                pass

    def send(self, method: str, headers: list[tuple[str, str]], data: bytes) -> None:
        """Send the request and read the status line and headers; raise ``TimeoutError`` past the deadline, and
        ``OSError`` for a status other than 2xx."""
        timer = threading.Timer(self.deadline, self.abort)
        timer.daemon = True
        timer.start()
        timed_out = False
        try:
            self.connection.request(method, self.path, body=data, headers=dict(headers))
            status, reason = (response := self.connection.getresponse()).status, response.reason
        except TimeoutError:  # the socket's own timeout, the same deadline, came first
            timed_out = True
        except Exception:
            if not self.expired:
                raise
        finally:
            timer.cancel()
            self.connection.close()
        if timed_out or self.expired:  # what was read before the shutdown (a status line, headers) is no answer
            raise TimeoutError(f"the push gateway did not answer within {self.deadline:.1f} s")
        if not 200 <= status < 300:
            raise OSError(f"error talking to pushgateway: {status} {reason}")


def _set(gauge: Gauge, value: float | None, *labels: str) -> None:
    """Set the labelled series, or remove it when there is no value (absent, not a -1 sentinel)."""
    if value is None:
        try:
            gauge.remove(*labels)
        except KeyError:  # prometheus_client before 0.21 raises for a series that was never set
            pass
    else:
        gauge.labels(*labels).set(value)
