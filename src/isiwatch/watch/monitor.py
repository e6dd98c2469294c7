"""``Watch``: the training-time monitor.

Every ``every_n_steps`` optimizer steps it runs one probe pass on a fixed probe batch, records the
per-layer curves, detects the phases and plateau onset, recommends a depth (`isiwatch.measure.depth`), raises
alerts, updates early stopping and exports to TensorBoard, Prometheus, JSONL and the exporters it is given; closing
it samples the last step once more if that step was not sampled. Between sampling steps ``step()`` is a modulo and a
return.
"""

from __future__ import annotations

import contextlib
import difflib
import gc
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.profiler import record_function

from .._utils.files import reserve_std_fds, shown_path
from .._utils.state import PRESENT, checked, is_count, is_number, optional
from ..measure.analysis import METRICS, Analysis, analyze_batch, tracked_metrics, untracked_reason
from ..measure.depth import recommend_depth
from ..measure.phases import PlateauTracker
from ..measure.probe_batch import ProbeBatch
from ..measure.recon import DEFAULT_RECON_COMPONENTS
from ..taps import ViTParts, input_problem, unwrap_model, vit_parts
from .alerts import Alert, AlertEngine, AlertRules, AlertSink, log_sink
from .config import WatchOptions, build_options
from .exporters import Exporter, JsonlExporter, PrometheusExporter, SampleContext, TensorBoardExporter
from .faults import KIND as FAULT_KIND
from .faults import FaultLog, to_stderr
from .freezing import KIND as FREEZE_KIND
from .freezing import Freezer, policy_of, wrapper_problem
from .log_folder import FolderInUse
from .sample import PLATEAU_SERIES, Sample, series_names
from .stopping import EarlyStopping, PlateauStopping

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

logger = logging.getLogger("isiwatch")

#: The share of the probe images the linear probes train on (`analyze`'s default): the rest is held out.
PROBE_TRAIN_FRACTION = 0.7

#: The fault source of the user's ``alert_callback``.
CALLBACK = "alert_callback"

#: The record of each change of the sampling interval under ``overhead_budget`` (one record, no episode).
INTERVAL_KIND = "sampling_interval"
#: The most the interval grows at one sample under ``overhead_budget``: one slow probe pass (a stall, a paused
#: process) doubles it once, and the next normal sample shortens it again.
STRETCH_STEP = 2
#: The longest interval ``overhead_budget`` may set, in multiples of ``every_n_steps``: the Watch never samples
#: less often than this, whatever its overhead.
MAX_STRETCH = 16
#: The Watch's clock for durations, in seconds: monotonic, so a wall-clock jump (NTP, a suspended VM) never
#: turns into a negative or a giant duration.
_clock = time.monotonic
#: A duration reading longer than this (seconds: a week) is a broken clock, not a measurement, and is discarded.
MAX_READING_S = 7 * 86400.0

#: A stretch to this many times ``every_n_steps`` or more is also one line on stderr (when no logging is set up).
WARN_STRETCH = 4


def _free_memory() -> None:
    """Return what a failed probe pass allocated to the device (its tensors are garbage once its frames are)."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.empty_cache()


#: The device types whose autocast `_own_numerics` turns off (torch's autocast devices that isiwatch runs on).
_AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps")


def _plausible(seconds: float) -> bool:
    """Whether a duration reading can be a real one: finite, positive and under `MAX_READING_S`."""
    return math.isfinite(seconds) and 0 < seconds < MAX_READING_S


def _own_numerics(model: nn.Module) -> contextlib.ExitStack:
    """Autocast off, on the CPU and on every device the model lives on, for the Watch's own forward passes: a
    training loop that calls ``step()`` inside ``torch.autocast`` must not change the probe pass's dtypes (its taps
    compute in the model's own dtype, or under ``probe_dtype``'s autocast around the forward alone), and the
    caller's autocast state is back as it was on exit."""
    stack = contextlib.ExitStack()
    devices = {"cpu"} | {p.device.type for p in model.parameters() if p.device.type in _AUTOCAST_DEVICES}
    for device in sorted(devices):
        stack.enter_context(torch.autocast(device, enabled=False))
    return stack


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _stall_entry(entry: object) -> bool:
    return isinstance(entry, (list, tuple)) and len(entry) == 2 and all(is_number(v) for v in entry)


def _check_probe_batch(parts: ViTParts, images: object, labels: object, opts: WatchOptions) -> None:
    """The probe batch fits the model and the options, checked without a forward pass."""
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


def _check_log_dir(log_dir: Path) -> None:
    """A ``log_dir`` that is a file, or lies under one, is a mistake refused now; a full or read-only disk is not
    (its exporters report it and try again at every write)."""
    for path in (log_dir, *log_dir.absolute().parents):
        if path.exists() and not path.is_dir():
            raise ValueError(f"log_dir {shown_path(log_dir)}: {shown_path(path)} is not a directory")


class Watch:
    """Monitor a ViT while it trains.

    ``probe_images`` (B,C,H,W) and optional ``probe_labels`` (B,) form the fixed probe batch (labels enable
    the linear probes and the [CLS] alert). Options (also from ``config``, a YAML path or dict; explicit
    keyword arguments win) are the fields of [`WatchOptions`][isiwatch.WatchOptions]:

    - sampling: ``every_n_steps``, ``probe_batch_size``, ``with_isi_recon``, ``history_size`` (samples
      kept in ``history``);
    - phases: ``phase_metric``, ``min_layers``, ``plateau_patience`` (samples a stable plateau must last
      before ``plateau_onset``);
    - alerts: ``isi_stall_window``/``isi_stall_min_rise``/``isi_stall_min_loss_drop`` (mean ISI rose by
      less than ``min_rise`` (relative) over the window while the loss fell by more than
      ``min_loss_drop`` (relative)), ``norm_friction_threshold``; ``alert_callback(alert)``;
    - early stopping (Lightning's names and rule): ``monitor`` (a series such as ``"probe_cls/last"``,
      ``"isi/layer_03"`` or ``"loss"``), ``mode``, ``min_delta``, ``patience``, ``check_finite``,
      ``stopping_threshold``, ``divergence_threshold``; isiwatch's own ``warmup`` (samples ignored first);
      ``stop_on_plateau``;
    - export: ``log_dir`` (TensorBoard + ``metrics.jsonl`` + ``alerts.jsonl``), ``registry`` (a
      prometheus_client ``CollectorRegistry``; a private one by default), ``prometheus_port`` (HTTP on
      ``prometheus_host``, 127.0.0.1 by default), ``pushgateway``, ``textfile``, ``run_name``; ``exporters``:
      more [`Exporter`][isiwatch.Exporter] instances (MLflow, W&B or your own), called after the
      built-in ones (kept in `exporters`);
    - faults: ``max_consecutive_failures`` (failed samples in a row after which the Watch disables itself),
      ``strict`` (re-raise instead, for tests and debugging);
    - cost: ``probe_every`` (the linear probes on every k-th sample only; the others
      carry no probe series), ``overhead_budget`` (opt-in, e.g. 0.005: the Watch stretches its sampling interval,
      in multiples of ``every_n_steps``, to keep its overhead ratio under this fraction of training time, and
      shortens it again, never below ``every_n_steps``, when there is room; it at most doubles per sample and
      never passes 16 × ``every_n_steps`` (`MAX_STRETCH`), so one stalled probe pass cannot stop the sampling;
      durations come from a monotonic clock, and a reading that is not positive, finite and under a week is
      discarded; each change is a ``sampling_interval`` record (one stderr line when it reaches 4 ×
      ``every_n_steps``), and the interval in effect, `interval`, is saved in
      [`state_dict`][isiwatch.Watch.state_dict]);
    - acting (experimental, off by default): ``freeze_settled`` (``True`` or a
      `FreezePolicy`): freeze the longest prefix of blocks whose output on
      the probe batch has settled (`isiwatch.watch.freezing`; each freeze is a ``blocks_frozen`` alert record, the
      prefix is in [`state_dict`][isiwatch.Watch.state_dict]; `freezer` holds the policy's state).

    Every sample measures the Watch's own cost (`Sample.overhead_s` and
    its ratio to the training time between samples), exported as the ``overhead/sample_seconds`` and
    ``overhead/ratio`` series (TensorBoard, ``metrics.jsonl``, Prometheus ``isiwatch_overhead_ratio``, the
    MLflow and W&B exporters).

    The options, the probe batch (shape, labels, channels against the model's patch embedding) and the names
    in ``monitor`` and ``phase_metric`` (against `series_names`, the series this model's samples hold)
    are checked here, without a forward pass: a ``ValueError`` now, not at the first sample mid-training.

    A failure inside the Watch never stops training (`isiwatch.watch.faults`): a probe pass that raises
    (an out-of-memory error is retried once in chunks a quarter the size) skips that sample, an exporter that
    raises is skipped for that call and tried again at the next, and each failing part is reported once, as a
    ``monitor_error`` alert record (and one line on stderr when the application set up no logging), and again
    when it has worked twice in a row (`isiwatch.watch.faults.CLEAR_AFTER`: a fault that comes and goes is one
    episode). The model, its modes and the RNG streams are left as they were either way.

    Under torch.distributed every rank runs the probe pass (required for sharded models); a failure on any rank
    makes every rank skip that sample, and all ranks reach the same stop decision; only rank 0 exports.
    """

    def __init__(self, model: nn.Module, probe_images: Tensor, probe_labels: Tensor | None = None, *,
                 every_n_steps: int | None = None, log_dir: str | Path | None = None,
                 registry: CollectorRegistry | None = None,
                 prometheus_port: int | None = None, run_name: str | None = None,
                 config: str | Path | dict[str, Any] | None = None, alert_callback: AlertSink | None = None,
                 exporters: Sequence[Exporter] = (), **options: Any):
        explicit = {k: v for k, v in {"every_n_steps": every_n_steps, "prometheus_port": prometheus_port,
                                      "run_name": run_name,
                                      "log_dir": None if log_dir is None else str(log_dir)}.items()
                    if v is not None}
        self.options = opts = build_options(config, **explicit, **options)  # range-checks every option
        self.model = model
        self._probe_model = unwrap_model(model)
        self._parts = vit_parts(self._probe_model)
        _check_probe_batch(self._parts, probe_images, probe_labels, opts)
        if opts.log_dir:
            _check_log_dir(Path(opts.log_dir))
        policy = policy_of(opts.freeze_settled)
        problem = wrapper_problem(model, self._probe_model) if policy else None
        if problem:
            raise ValueError(problem)
        #: The freeze policy's state and actions (``freeze_settled``), None when it is off.
        self.freezer = Freezer(self._probe_model, self._parts, policy, probe_images) if policy else None
        self.probe_images = probe_images
        self.probe_labels = probe_labels
        # the probe split, label codes and device copies, fixed with the probe batch: made once, not per sample
        self._probe_batch = ProbeBatch(probe_images, probe_labels, PROBE_TRAIN_FRACTION)
        for exporter in exporters:
            if not isinstance(exporter, Exporter):
                raise TypeError(f"exporters must be isiwatch.watch.exporters.Exporter instances, got "
                                f"{type(exporter).__name__}")
        metrics = tracked_metrics(self._parts.has_cls, probe_labels is not None, opts.with_isi_recon)
        #: Every series a sample of this model can hold: what ``monitor`` may name.
        self.series_names = frozenset(series_names(metrics, self._parts.depth))
        self._check_series(probe_labels is not None)
        #: The run's name in every export; without ``run_name`` a random one, replaced by the saved run's name
        #: on ``load_state_dict``, so a resumed run stays one run.
        self.run = opts.run_name or f"run-{uuid.uuid4().hex[:8]}"
        self.rank = torch.distributed.get_rank() if _distributed() else 0
        self.history: deque[Sample] = deque(maxlen=opts.history_size)
        self.tracker, self.stoppers, self.plateau_stopper = self._new_policies()
        self.rules = AlertRules(opts.phase_metric, opts.isi_stall_window, opts.isi_stall_min_rise,
                                opts.isi_stall_min_loss_drop, opts.norm_friction_threshold)
        self.should_stop = False
        self.stop_reason: str | None = None
        self.last_step: int | None = None
        #: Factor applied to the loss when a sample reads it (a framework that hands over a scaled loss, e.g.
        #: Lightning's loss divided by gradient accumulation, sets it once instead of rescaling every step).
        self.loss_scale = 1.0
        self._seen_step: int | None = None  # the last step() call, for the final sample
        self._seen_loss: float | Tensor | None = None
        self._closed = False

        #: Where samples and alert records go, in call order: the built-in exporters the options ask for, then
        #: ``exporters``. Empty on ranks other than 0, and once the Watch is closed.
        self.exporters: list[Exporter] = []
        self._prometheus: PrometheusExporter | None = None
        if self.rank == 0:
            reserve_std_fds()  # before any exporter opens a file or a socket
            if opts.log_dir:
                self.exporters += [JsonlExporter(opts.log_dir, self.run),  # refused if another Watch writes there
                                   TensorBoardExporter(opts.log_dir, opts.heatmap_every)]
            if registry is not None or opts.prometheus_port is not None or opts.pushgateway or opts.textfile:
                self._prometheus = PrometheusExporter(self.run, registry, opts.prometheus_port,
                                                      opts.prometheus_host, opts.pushgateway, opts.textfile)
                self.exporters.append(self._prometheus)
            self.exporters += exporters
        self._alert_callback = alert_callback
        self._emitted: list[Alert] = []  # the records dispatched during the sample in progress
        sinks: list[AlertSink] = [self._emitted.append, log_sink, self._write_alert]
        if alert_callback is not None:
            sinks.append(self._call_back)
        self.alerts = AlertEngine(self.run, sinks)
        self.faults = FaultLog(self.alerts, echo=self.rank == 0)  # one rank speaks for the job
        self._each("open")  # a backend that cannot open (a full or read-only disk) is reported now, retried later
        #: Set once ``max_consecutive_failures`` samples in a row failed: ``step`` does nothing after that.
        self.disabled = False
        self._failed_in_a_row = 0
        #: Steps between samples now: ``every_n_steps``, or a multiple of it under ``overhead_budget``.
        self.interval = opts.every_n_steps
        self._samples_taken = 0  # measured samples in this process: probe_every counts them
        self._last_end: float | None = None  # _clock() when the previous sample's work ended
        self._last_end_step: int | None = None  # the step of that sample
        self._after_measure_s = 0.0  # the previous sample's work after its measurement, charged to the next
        self._measured_at: float | None = None

    @property
    def prometheus(self) -> PrometheusExporter | None:
        """The built-in Prometheus exporter (its ``port`` is the HTTP server's), or None when the options ask for
        none or this is not rank 0."""
        return self._prometheus

    def _each(self, hook: str, *args: Any) -> list[Any]:
        """Call ``hook`` (an [`Exporter`][isiwatch.Exporter] method) on every exporter, in order, and
        return what the calls that worked returned. One that raises is reported (`faults`) and skipped; the
        next call tries it again, and its next ``write_sample`` that works closes the fault."""
        names = [type(exporter).__name__ for exporter in self.exporters]
        results = []
        if self.exporters:
            reserve_std_fds()  # stderr may have been closed since the last call; an exporter may open a file now
        for i, exporter in enumerate(list(self.exporters)):
            source = f"exporter {names[i]}" if names.count(names[i]) == 1 else f"exporter {names[i]}[{i}]"
            in_use = f"{source} (log_dir in use)"  # its own episode: said even while the exporter already fails
            try:
                results.append(getattr(exporter, hook)(*args))
            except Exception as exc:
                if self.options.strict:
                    raise
                self.faults.failed(in_use if isinstance(exc, FolderInUse) else source, self.last_step or 0, exc)
            else:
                if hook == "write_sample":
                    self.faults.recovered(source, self.last_step or 0)
                    self.faults.recovered(in_use, self.last_step or 0)
        return results

    def _write_alert(self, alert: Alert) -> None:
        self._each("write_alert", alert)

    def _call_back(self, alert: Alert) -> None:
        """Hand ``alert`` to the user's ``alert_callback``; one that raises is reported like every other failing
        part (`faults`, source ``alert_callback``), and the next record of another source it takes closes
        that episode."""
        assert self._alert_callback is not None
        try:
            self._alert_callback(alert)
        except Exception as exc:
            self.faults.failed(CALLBACK, alert.step, exc)
        else:
            if alert.data.get("source") != CALLBACK:  # its own episode's records do not close it
                self.faults.recovered(CALLBACK, alert.step)

    def _context(self) -> SampleContext:
        return SampleContext(self.run, tuple(self.history), self.tracker.onset_step, frozenset(self.alerts.active),
                             dict(self.alerts.opened), self.should_stop)

    def _check_series(self, probes: bool) -> None:
        """``phase_metric`` and ``monitor`` name curves this model's samples will have (checked here, not at
        the first sample, which may be hours into training)."""
        opts, parts = self.options, self._parts
        reason = untracked_reason(opts.phase_metric, parts.has_cls, probes, opts.with_isi_recon)
        if reason:
            raise ValueError(f"phase_metric {opts.phase_metric!r} cannot be tracked: {reason}")
        if not opts.monitor or opts.monitor in self.series_names:
            return
        metric, _, part = opts.monitor.partition("/")
        reason = untracked_reason(metric, parts.has_cls, probes, opts.with_isi_recon) if part else None
        if reason and metric in METRICS:
            hint = reason
        else:
            close = difflib.get_close_matches(opts.monitor, sorted(self.series_names), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            hint += (f"series are <metric>/layer_00…layer_{parts.depth - 1:02d}, <metric>/last and <metric>/mean "
                     f"for {', '.join(m for m in METRICS if f'{m}/last' in self.series_names)}; "
                     f"{', '.join(PLATEAU_SERIES)}, recommended_depth and loss")
        raise ValueError(f"monitor {opts.monitor!r} is not a tracked series: {hint}")

    def _new_policies(self) -> tuple[PlateauTracker, list[EarlyStopping], PlateauStopping | None]:
        """Fresh onset tracking and early-stopping policies from the options."""
        opts = self.options
        stoppers = [EarlyStopping(opts.monitor, opts.mode, opts.min_delta, opts.patience, opts.warmup,
                                  opts.check_finite, opts.stopping_threshold, opts.divergence_threshold)
                    ] if opts.monitor else []
        plateau_stopper = PlateauStopping(opts.plateau_patience) if opts.stop_on_plateau else None
        return PlateauTracker(opts.plateau_patience), stoppers, plateau_stopper

    # -- sampling ---------------------------------------------------------------------------------
    def step(self, global_step: int, loss: float | Tensor | None = None) -> list[Alert]:
        """Call after every optimizer step; samples when ``global_step`` is a multiple of ``every_n_steps``.

        ``loss`` (optional, read only on sampling steps and by [`finish`][isiwatch.Watch.finish]) feeds the
        ``isi_stall`` alert and the ``loss`` series. Returns every record emitted at this step, in the order they
        were dispatched: alert episodes opening and clearing, ``early_stop``, ``blocks_frozen`` and the Watch's own
        ``monitor_error``/``monitor_error_cleared`` and ``sampling_interval`` records (empty between samples).
        """
        self._seen_step, self._seen_loss = global_step, loss
        if global_step % self.interval or global_step == self.last_step:
            return []
        return self.sample(global_step, loss)

    def finish(self) -> list[Alert]:
        """Sample the last step passed to [`step`][isiwatch.Watch.step] unless it was sampled: the final weights are
        always in the record, and a run shorter than ``every_n_steps`` has one sample, not none.

        The final sample is recorded and exported, but updates no policy: not early stopping (training is over,
        and ``stop_reason`` must not claim a stop that did not happen), and neither the alert episodes nor onset
        tracking. The frameworks write their last checkpoint before it, so a run resumed from that checkpoint
        would repeat an opening or a clearing the final sample had recorded. Returns the records it emitted: only the
        Watch's own (``monitor_error`` and its clearing), as no policy runs.
        [`close`][isiwatch.Watch.close] calls it; the integrations call it earlier, while the framework's loggers are
        open."""
        if self._seen_step is None or self._seen_step == self.last_step:
            return []
        return self._sample(self._seen_step, self._seen_loss, policies=False)

    def sample(self, global_step: int, loss: float | Tensor | None = None) -> list[Alert]:
        """Run one probe pass now, regardless of ``every_n_steps``; returns the records emitted, as
        [`step`][isiwatch.Watch.step]."""
        return self._sample(global_step, loss, policies=True)

    def _sample(self, global_step: int, loss: float | Tensor | None, policies: bool) -> list[Alert]:
        if self.disabled:
            return []
        begin = _clock()
        self._emitted.clear()
        try:
            with record_function("isiwatch.sample"), _own_numerics(self._probe_model):
                self._sample_now(global_step, loss, policies, begin)
            return list(self._emitted)
        finally:
            self._emitted.clear()
            self._last_end, self._last_end_step = _clock(), global_step
            if self._measured_at is not None:  # what this sample did after measuring is charged to the next
                self._after_measure_s += self._last_end - self._measured_at
                self._measured_at = None

    def _sample_now(self, global_step: int, loss: float | Tensor | None, policies: bool, begin: float) -> None:
        """One sample; ``policies``: also update onset tracking, alert episodes, early stopping and the interval
        (all but the final sample)."""
        self.last_step = global_step
        probes = self._samples_taken % self.options.probe_every == 0
        failure: Exception | None = None
        try:
            sample = self._measure(global_step, loss, probes)
        except Exception as exc:
            if self.options.strict:
                raise
            failure = exc
        measured = _clock()
        self._charge(sample if failure is None else None, begin, measured)
        # every rank takes part in the same collectives in the same order, whatever failed where
        if self._any_rank(failure is not None):
            self._skip(global_step, failure or "it failed on another rank")
            return
        self._samples_taken += 1
        self._failed_in_a_row = 0
        self.faults.recovered("probe pass", global_step)
        self.history.append(sample)
        if policies:
            self._update_policies(sample, probes)
        self._each("write_sample", sample, self._context())

    def _update_policies(self, sample: Sample, probes: bool) -> None:
        """Onset tracking, alert episodes, early stopping, the freeze policy and the budget's interval, updated
        with ``sample`` (``probes``: it has its linear probes)."""
        try:
            self.tracker.update(sample.step, sample.phases)
            self.alerts.update(sample.step, self.rules.conditions(sample, self.tracker))
            reason = self._stop_reason(sample, probes)
        except Exception as exc:
            if self.options.strict:
                raise
            self.faults.failed("alert rules", sample.step, exc)
            reason = None
        else:
            self.faults.recovered("alert rules", sample.step)
        if self._any_rank(reason is not None) and not self.should_stop:
            self.should_stop = True
            self.stop_reason = reason or "another rank requested the stop"
            self.alerts.dispatch(Alert("early_stop", sample.step, time.time(), self.run, "warning",
                                       f"stopping training: {self.stop_reason}"))
        if self.freezer is not None:
            self._freeze(sample.step)
        if self.options.overhead_budget is not None:
            self._fit_budget(sample.overhead_ratio, self.options.overhead_budget, sample.step)

    def _freeze(self, step: int) -> None:
        """The freeze policy at this sample; every rank freezes the same prefix at the same step (the smallest
        any rank asks for), and each freeze is a ``blocks_frozen`` alert record."""
        assert self.freezer is not None
        failures: list[Exception] = []

        def failed(exc: Exception) -> None:
            if self.options.strict:
                raise exc
            failures.append(exc)
            self.faults.failed("freeze policy", step, exc)

        before = self.freezer.frozen
        plan = self.freezer.update(lambda n: int(-self._max_over_ranks(-float(n))), failed)
        if not failures:
            self.faults.recovered("freeze policy", step)
        if plan is not None:
            self.alerts.dispatch(Alert(FREEZE_KIND, step, time.time(), self.run, "info",
                                       self.freezer.message(plan, before), self.freezer.record_data(plan, before)))

    def _charge(self, sample: Sample | None, begin: float, measured: float) -> None:
        """Set ``sample``'s overhead (see `Sample`): its measurement plus the
        previous sample's work after measuring and the exporters' background work since (heat-map renders), over
        the training time since the previous sample ended. Called before anything reads the sample's series; a
        failed sample's cost is carried to the next."""
        cost = measured - begin + self._after_measure_s + self._background_seconds()
        self._measured_at = measured
        if sample is None:
            self._after_measure_s = cost if _plausible(cost) else 0.0
            return
        self._after_measure_s = 0.0
        trained = None if self._last_end is None else begin - self._last_end
        if not _plausible(cost) or (trained is not None and not _plausible(trained)):
            logger.info("isiwatch: step %d: discarded an impossible duration reading (cost %r s, training %r s); "
                        "the sampling interval stays %d", sample.step, cost, trained, self.interval)
            return  # neither series nor the budget act on it
        sample.overhead_s = cost
        if trained is not None:
            sample.overhead_ratio = cost / self._interval_seconds(sample.step, trained)

    def _interval_seconds(self, step: int, trained: float) -> float:
        """The training seconds a sample at ``step`` is charged against: ``trained``, the training time since the
        previous sample ended, stretched to a full `interval` at the same pace when the sample came fewer steps
        after the previous one (the closing sample of `finish`, an explicit `sample`): the series stays the cost of
        sampling every `interval` steps instead of jumping by the interval over the steps at the closing sample."""
        steps = step - (self._last_end_step or 0)
        return trained * self.interval / steps if 0 < steps < self.interval else trained

    def _background_seconds(self) -> float:
        """The exporters' CPU seconds off the training thread since the last sample; one that raises is reported
        (`faults`, through `_each`) and counts nothing."""
        return sum(float(seconds) for seconds in self._each("background_seconds"))

    def _fit_budget(self, ratio: float | None, budget: float, step: int) -> None:
        """Stretch (or shorten, with hysteresis: only to half or less) `interval` so the overhead ratio
        stays under ``budget``, in multiples of ``every_n_steps``: at most `STRETCH_STEP` times longer per sample
        and never past `MAX_STRETCH` times ``every_n_steps``, so no single measurement (one stalled probe pass)
        can stop the sampling. Each change is a ``sampling_interval`` record; one that reaches `WARN_STRETCH`
        times ``every_n_steps`` from below is also one line on stderr. A sample without a ratio (the first, or
        one whose clock readings were discarded) changes nothing. Under torch.distributed every rank takes the
        longest interval any rank asks for (one all-reduce, on sampling steps only)."""
        base = self.options.every_n_steps
        wanted = self.interval
        if ratio is not None and math.isfinite(ratio):
            needed = base * math.ceil(self.interval * ratio / budget / base)
            if needed > self.interval:
                wanted = min(needed, self.interval * STRETCH_STEP, base * MAX_STRETCH)
            elif needed <= self.interval // 2:
                wanted = max(base, needed)
        wanted = int(self._max_over_ranks(float(wanted)))
        if wanted == self.interval:
            return
        previous, self.interval = self.interval, wanted
        shown = ratio if ratio is not None else math.nan
        self.alerts.dispatch(Alert(
            INTERVAL_KIND, step, time.time(), self.run, "info",
            f"overhead ratio {shown:.4f} against a budget of {budget:.4f}: sampling every {wanted} steps instead "
            f"of {previous}", {"interval": wanted, "previous": previous, "ratio": ratio, "budget": budget,
                               "max_interval": base * MAX_STRETCH}))
        if self.faults.echo and previous < base * WARN_STRETCH <= wanted:
            to_stderr(f"isiwatch: warning: step {step}: sampling every {wanted} steps instead of every_n_steps="
                      f"{base}: the Watch's overhead (ratio {shown:.4f}) is over overhead_budget={budget}; it never "
                      f"samples less often than every {base * MAX_STRETCH} steps")

    def _measure(self, global_step: int, loss: float | Tensor | None, probes: bool = True) -> Sample:
        """The probe pass and everything computed from it (the linear probes only when ``probes``), read on the
        host once together with the loss. An out-of-memory error frees what the pass held and retries once in
        chunks a quarter the size."""
        start = _clock()
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
            loss = (read["loss"][0] if isinstance(loss, Tensor) else float(loss)) * self.loss_scale
        recommendation = recommend_depth(analysis)
        return Sample(global_step, time.time(), analysis.layers, analysis.phases, _clock() - start,
                      loss, recommendation)

    def _analyze(self, batch_size: int, probes: bool, extra: dict[str, Tensor]
                 ) -> tuple[Analysis, dict[str, list[float]]]:
        opts = self.options
        options = {"batch_size": batch_size, "isi_recon": opts.with_isi_recon,
                   "recon_components": DEFAULT_RECON_COMPONENTS, "probe_train_fraction": PROBE_TRAIN_FRACTION,
                   "seed": 0}
        with self.freezer.recording() if self.freezer else contextlib.nullcontext():
            return analyze_batch(self._probe_model, self._probe_batch, options, probes=probes,
                                 phase_metric=opts.phase_metric, phase_options={"min_layers": opts.min_layers},
                                 parts=self._parts, extra=extra,
                                 forward_dtype=getattr(torch, opts.probe_dtype) if opts.probe_dtype else None)

    def _skip(self, global_step: int, failure: Exception | str) -> None:
        """A sample that failed (here or on another rank): report it, and disable the Watch after
        ``max_consecutive_failures`` in a row."""
        self.faults.failed("probe pass", global_step, failure)
        self._failed_in_a_row += 1
        if self._failed_in_a_row >= self.options.max_consecutive_failures:
            self.disabled = True
            self.faults.report(Alert(FAULT_KIND, global_step, time.time(), self.run, "critical",
                                     f"isiwatch disabled itself after {self._failed_in_a_row} failed samples in a "
                                     f"row; training continues unmonitored", {"source": "watch", "disabled": True}))

    def _stop_reason(self, sample: Sample, probes: bool) -> str | None:
        """Update the early-stopping policies with ``sample`` (a sample without its probes, under
        ``probe_every``, leaves the plateau rule, which reads the probe accuracy, as it was); the first reason to
        stop, if any."""
        series = sample.series()
        reasons = [stopper.update(series.get(stopper.monitor)) for stopper in self.stoppers]
        if self.plateau_stopper is not None and probes:
            reasons.append(self.plateau_stopper.update(sample.phases, sample.last_layer_accuracy()))
        return next((r for r in reasons if r), None)

    def _any_rank(self, flag: bool) -> bool:
        """Every rank gets the same answer: whether ``flag`` is set on any rank (one all-reduce when distributed)."""
        return bool(self._max_over_ranks(float(flag)))

    def _max_over_ranks(self, value: float) -> float:
        """The largest ``value`` over all ranks (one all-reduce when distributed; call it on every rank at the same
        point of the same sample, never between samples, where it could meet the model's own collectives)."""
        if not _distributed():
            return value
        device = "cuda" if torch.distributed.get_backend() == "nccl" else "cpu"
        tensor = torch.tensor([value], device=device)
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
        return float(tensor.item())

    # -- state ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume alerts, onset tracking and early stopping (not the history)."""
        return {"version": 1, "run": self.run, "step": self._position(), "last_step": self.last_step,
                "should_stop": self.should_stop, "stop_reason": self.stop_reason, "tracker": self.tracker.state_dict(),
                "alerts": self._alert_state(), "stoppers": [s.state_dict() for s in self.stoppers],
                "plateau_stopper": self.plateau_stopper.state_dict() if self.plateau_stopper else None,
                "isi_stall": [list(p) for p in self.rules.stall], "interval": self.interval,
                "freezer": self.freezer.state_dict() if self.freezer else None}

    def _position(self) -> int | None:
        """The step the run has reached: the last one passed to ``step`` or sampled (None before either). A run
        resumed from this state continues after it, so what a crashed run logged for later steps is dropped."""
        return max((s for s in (self._seen_step, self.last_step) if s is not None), default=None)

    def _alert_state(self) -> dict[str, Any]:
        """The alert episodes to resume, less ``monitor_error``: a fault belongs to this process, not the run."""
        state = self.alerts.state_dict()
        state["active"] = [k for k in state["active"] if k != FAULT_KIND]
        state["opened"].pop(FAULT_KIND, None)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore [`state_dict`][isiwatch.Watch.state_dict]'s output, all or nothing: the whole state is validated (and
        loaded into fresh policies) before anything is assigned, so a bad state raises ``ValueError`` naming the field
        and leaves the Watch as it was."""
        version = checked(state, "Watch state", version=PRESENT)["version"]
        if version != 1:
            raise ValueError(f"unsupported Watch state version {version!r}")
        s = checked(state, "Watch state", last_step=(optional(is_count), "null or an int >= 0"),
                    should_stop=(lambda v: isinstance(v, bool), "a bool"),
                    stop_reason=(optional(lambda v: isinstance(v, str)), "null or a string"),
                    tracker=PRESENT, alerts=PRESENT, plateau_stopper=PRESENT,
                    stoppers=(lambda v: isinstance(v, (list, tuple)) and len(v) == len(self.stoppers),
                              f"a list of {len(self.stoppers)} early-stopping states (this Watch's monitor)"),
                    isi_stall=(lambda v: isinstance(v, (list, tuple)) and all(_stall_entry(p) for p in v),
                               "a list of [mean ISI, loss] pairs"))
        run = state.get("run", self.run)  # absent in states saved before isiwatch recorded it
        if not isinstance(run, str) or not run:
            raise ValueError(f"invalid Watch state: 'run' must be a non-empty string, got {run!r}")
        saved, run = run, self.options.run_name or run  # an explicit run_name wins over the saved one
        step = state.get("step", s["last_step"])  # absent in states saved before isiwatch recorded it
        if step is not None and not is_count(step):
            raise ValueError(f"invalid Watch state: 'step' must be null or an int >= 0, got {step!r}")
        interval = state.get("interval", self.options.every_n_steps)  # absent in states saved before it existed
        if not is_count(interval) or interval < 1:
            raise ValueError(f"invalid Watch state: 'interval' must be an int >= 1, got {interval!r}")
        # the budget's stretched interval carries over, as a multiple of this run's every_n_steps
        base = self.options.every_n_steps
        interval = min(base * MAX_STRETCH, base * max(1, math.ceil(interval / base))) \
            if self.options.overhead_budget is not None else base
        tracker, stoppers, plateau_stopper = self._new_policies()
        alerts = AlertEngine(run)
        tracker.load_state_dict(s["tracker"], "Watch state['tracker']")
        alerts.load_state_dict(s["alerts"], "Watch state['alerts']")
        for i, (stopper, sub) in enumerate(zip(stoppers, s["stoppers"])):
            stopper.load_state_dict(sub, f"Watch state['stoppers'][{i}]")
        if plateau_stopper is not None and s["plateau_stopper"] is not None:
            plateau_stopper.load_state_dict(s["plateau_stopper"], "Watch state['plateau_stopper']")
        # everything is valid: assign (the freezer checks its state before it freezes anything)
        if self.freezer is not None and state.get("freezer") is not None:  # absent before freeze_settled existed
            self.freezer.load_state_dict(state["freezer"], "Watch state['freezer']")
        self._rename(run)
        self.last_step, self.should_stop, self.stop_reason = s["last_step"], s["should_stop"], s["stop_reason"]
        self.tracker, self.stoppers, self.plateau_stopper = tracker, stoppers, plateau_stopper
        self.alerts.active = alerts.active | (self.alerts.active & {FAULT_KIND})
        self.alerts.opened = {**alerts.opened, **{k: v for k, v in self.alerts.opened.items() if k == FAULT_KIND}}
        self.interval = interval
        self.rules.stall.clear()
        self.rules.stall.extend((float(i), float(loss)) for i, loss in s["isi_stall"])
        if step is not None:  # what a crashed run logged after the checkpoint goes: the resumed run logs it anew
            self._each("resume", saved, step)

    def _rename(self, run: str) -> None:
        if run == self.run:
            return
        self.run = self.alerts.run = run
        self._each("rename", run)

    # -- lifetime ---------------------------------------------------------------------------------
    def close(self, *, final_sample: bool = True) -> None:
        """Take the final sample ([`finish`][isiwatch.Watch.finish]; ``final_sample=False`` skips it, e.g. after a
        crash), warn if the run has no sample at all, then flush and close the exporters (heat-maps are written one last
        time). A second call does nothing."""
        if self._closed:
            return
        self._closed = True
        if final_sample:
            self.finish()
            if self.last_step is None:
                logger.warning("isiwatch: run %s ended without a single sample: step() was never called, so "
                               "nothing was recorded", self.run)
        self._seen_loss = None  # may hold the caller's loss tensor
        self._each("close", self._context())
        self.exporters = []

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(final_sample=exc_type is None)  # no probe pass on a model an exception left behind
