"""``Watch``: the training-time monitor, an orchestrator over parts that return data (`probe_pass`, `sampling_clock`,
`policies`, `fanout` to the exporters and ``alert_callback``, `saved_state`, the guard of `faults`). Only the Watch
dispatches alert records and agrees with the other ranks (`ranks`). Between samples ``step()`` is a modulo and a return.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn
from torch.profiler import record_function

from ..taps import unwrap_model, vit_parts
from .alerts import Alert, AlertRules, AlertSink
from .checks import check_arguments
from .config import build_options
from .exporters import Exporter, PrometheusExporter, SampleContext
from .fanout import Fanout, build_exporters, folder_exporters
from .faults import PROBE_PASS, to_stderr
from .freezing import KIND as FREEZE_KIND
from .freezing import Freezer, policy_of
from .log_folder import LogFolderLock
from .policies import Policies, freeze, new_policies, stop_reason
from .probe_pass import ProbePass, own_numerics
from .published_depth import PublishedDepth
from .ranks import any_rank, max_over_ranks, min_over_ranks, rank
from .run_folder import discard_unused, resumed_dir, run_dir_of
from .sample import Sample
from .sampling_clock import INTERVAL_KIND, SamplingClock
from .saved_state import SavedState, read_state, resume_alerts

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

logger = logging.getLogger("isiwatch")


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
      ``min_loss_drop`` (relative)), ``norm_friction_threshold``; ``probe_confidence`` (the exact paired test
      on the probes' held-out predictions behind ``cls_marginalized`` and the published depth);
      ``alert_callback(alert)``;
    - early stopping (Lightning's names and rule): ``monitor`` (a series such as ``"probe_cls/last"``,
      ``"isi/layer_03"`` or ``"loss"``), ``mode``, ``min_delta``, ``patience``, ``check_finite``,
      ``stopping_threshold``, ``divergence_threshold``; isiwatch's own ``warmup`` (samples ignored first);
      ``stop_on_plateau``;
    - export: ``log_dir`` (TensorBoard + ``metrics.jsonl`` + ``alerts.jsonl`` in the run's own folder there,
      `run_dir`; ``run_folder`` names it instead), ``registry`` (a
      prometheus_client ``CollectorRegistry``; a private one by default), ``prometheus_port`` (HTTP on
      ``prometheus_host``, 127.0.0.1 by default), ``pushgateway``, ``textfile``, ``run_name``; ``exporters``:
      more [`Exporter`][isiwatch.Exporter] instances (MLflow, W&B or your own), called after the
      built-in ones (kept in `exporters`);
    - faults: ``max_consecutive_failures`` (failed samples in a row after which the Watch disables itself),
      ``strict`` (re-raise instead, for tests and debugging);
    - cost: ``probe_every`` (the linear probes on every k-th sample only; the others carry no probe series),
      ``overhead_budget`` (opt-in, e.g. 0.005: the Watch stretches its sampling interval, in multiples of
      ``every_n_steps``, to keep its overhead ratio under this fraction of training time, and shortens it again,
      never below ``every_n_steps``, when there is room; it at most doubles per sample and never passes 16 ×
      ``every_n_steps`` (`isiwatch.watch.sampling_clock.MAX_STRETCH`), so one stalled probe pass cannot stop the
      sampling; durations come from a monotonic clock, and a reading that is not positive, finite and under a week
      is discarded; each change is a ``sampling_interval`` record (one stderr line when it reaches 4 ×
      ``every_n_steps``), and the interval in effect, `interval`, is saved in
      [`state_dict`][isiwatch.Watch.state_dict]);
    - acting (experimental, off by default): ``freeze_settled`` (``True`` or a
      `FreezePolicy`): freeze the longest prefix of blocks whose output on
      the probe batch has settled (`isiwatch.watch.freezing`; each freeze is a ``blocks_frozen`` alert record, the
      prefix is in [`state_dict`][isiwatch.Watch.state_dict]; `freezer` holds the policy's state).

    Every sample measures the Watch's own cost (`Sample.overhead_s` and
    its ratio to the training time between samples), exported as the ``overhead/seconds`` and
    ``overhead/ratio`` series (TensorBoard, ``metrics.jsonl``, Prometheus ``isiwatch_overhead_seconds`` and
    ``isiwatch_overhead_ratio``, the MLflow and W&B exporters); the sample's duration (`Sample.duration_s`, its
    probe pass and metrics alone) is ``sample_duration_seconds`` in TensorBoard and Prometheus.

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
                 registry: CollectorRegistry | None = None, prometheus_port: int | None = None,
                 run_name: str | None = None, config: str | Path | dict[str, Any] | None = None,
                 alert_callback: AlertSink | None = None, exporters: Sequence[Exporter] = (), **options: Any):
        explicit = {"every_n_steps": every_n_steps, "prometheus_port": prometheus_port, "run_name": run_name,
                    "log_dir": None if log_dir is None else str(log_dir)}
        self.options = opts = build_options(config, **{k: v for k, v in explicit.items() if v is not None}, **options)
        self.model, self._probe_model = model, unwrap_model(model)
        parts = vit_parts(self._probe_model)
        #: Every series a sample of this model can hold: what ``monitor`` may name.
        self.series_names = check_arguments(model, self._probe_model, parts, probe_images, probe_labels, opts,
                                            exporters)
        #: The freeze policy's state and actions (``freeze_settled``), None when it is off.
        policy = policy_of(opts.freeze_settled)
        self.freezer = Freezer(self._probe_model, parts, policy, probe_images) if policy else None
        self.probe_images, self.probe_labels = probe_images, probe_labels
        self._probe = ProbePass(self._probe_model, parts, probe_images, probe_labels, opts, self.freezer)
        #: The run's name in every export; without ``run_name`` a random one, replaced by the saved run's name
        #: on ``load_state_dict``, so a resumed run stays one run.
        self.run = opts.run_name or f"run-{uuid.uuid4().hex[:8]}"
        self.rank = rank()
        self.history: deque[Sample] = deque(maxlen=opts.history_size)
        self.tracker, self.stoppers, self.plateau_stopper = new_policies(opts)
        self.rules = AlertRules(opts.phase_metric, opts.isi_stall_window, opts.isi_stall_min_rise,
                                opts.isi_stall_min_loss_drop, opts.norm_friction_threshold,
                                probe_confidence=opts.probe_confidence)
        #: The depth recommendation published with each sample (`isiwatch.watch.published_depth`).
        self.published_depth = PublishedDepth(opts.probe_confidence, probe_labels is not None)
        self.should_stop = False
        self.stop_reason: str | None = None
        self.last_step: int | None = None
        #: Factor applied to the loss when a sample reads it (a framework that hands over a scaled loss, e.g.
        #: Lightning's loss divided by gradient accumulation, sets it once instead of rescaling every step).
        self.loss_scale = 1.0
        self._seen_step: int | None = None  # the last step() call, for the final sample
        self._seen_loss: float | Tensor | None = None
        self._closed = False
        #: The run's folder under ``log_dir`` (`isiwatch.watch.run_folder`): a new one, or the one ``run_folder``
        #: names; the saved run's once [`load_state_dict`][isiwatch.Watch.load_state_dict] resumes it. None without
        #: ``log_dir`` and on ranks other than 0.
        self.run_dir = run_dir_of(opts, self.run) if opts.log_dir and self.rank == 0 else None
        #: Where samples and alert records go, in call order: the built-in exporters the options ask for, then
        #: ``exporters``. Empty on ranks other than 0, and once the Watch is closed.
        built = build_exporters(opts, self.run, self.run_dir, registry, exporters) if self.rank == 0 else ([], None)
        self.exporters, self._prometheus = built
        self._in_run_dir = self.exporters[:2] if self.run_dir is not None else []  # JSONL and TensorBoard
        self._loaded_folder: str | None = None  # a loaded state's run folder, saved on by a Watch that writes none
        self._fanout = Fanout(self.run, lambda: self.exporters, opts, lambda: self.last_step or 0, alert_callback,
                              echo=self.rank == 0)
        self.alerts, self.faults = self._fanout.alerts, self._fanout.faults
        self._fanout.each("open")  # a backend that cannot open (a full disk) is reported now, and retried later
        #: Set once ``max_consecutive_failures`` samples in a row failed: ``step`` does nothing after that.
        self.disabled = False
        #: Steps between samples now: ``every_n_steps``, or a multiple of it under ``overhead_budget``.
        self.interval = opts.every_n_steps
        self._clock = SamplingClock(opts.every_n_steps)
        self._samples_taken = 0  # measured samples in this process: probe_every counts them

    @property
    def prometheus(self) -> PrometheusExporter | None:
        """The built-in Prometheus exporter (its ``port`` is the HTTP server's), or None when the options ask for
        none or this is not rank 0."""
        return self._prometheus

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
        with (self._clock.timing(global_step), self._fanout.collecting() as emitted,
              record_function("isiwatch.sample"), own_numerics(self._probe_model)):
            self._sample_now(global_step, loss, policies)
            return list(emitted)

    def _sample_now(self, global_step: int, loss: float | Tensor | None, policies: bool) -> None:
        """One sample; ``policies``: also update onset tracking, alert episodes, early stopping and the interval
        (all but the final sample)."""
        self.last_step = global_step
        probes = self._samples_taken % self.options.probe_every == 0
        sample = None
        with self.faults.guard(PROBE_PASS, global_step, strict=self.options.strict, report=False,
                               recover=False) as measuring:
            sample = self.published_depth.publish(self._probe.measure(global_step, loss, probes, self.loss_scale))
        self._clock.charge(sample, self.interval, self._fanout.background_seconds)
        if any_rank(sample is None) or sample is None:  # every rank makes the same collectives, whatever failed where
            self.disabled = self.faults.sample_failed(global_step, measuring.failure or "it failed on another rank",
                                                      self.options.max_consecutive_failures)
            return
        self._samples_taken += 1
        self.faults.sample_worked(global_step)
        self.history.append(sample)
        if policies:
            self._update_policies(sample, probes)
        self._fanout.each("write_sample", sample, self._context())

    def _update_policies(self, sample: Sample, probes: bool) -> None:
        """Onset tracking, alert episodes, early stopping, the freeze policy and the budget's interval, updated
        with ``sample`` (``probes``: it has its linear probes); every rank reaches the same decisions."""
        step, reason = sample.step, None
        with self.faults.guard("alert rules", step, strict=self.options.strict):
            self.tracker.update(step, sample.phases)
            self.alerts.update(step, self.rules.conditions(sample, self.tracker, self.alerts.active))
            reason = stop_reason(sample, probes, self.stoppers, self.plateau_stopper)
        if any_rank(reason is not None) and not self.should_stop:
            self.should_stop = True
            self.stop_reason = reason or "another rank requested the stop"
            self._record("early_stop", step, "warning", f"stopping training: {self.stop_reason}")
        if self.freezer is not None:  # the smallest prefix any rank asks for
            guard = self.faults.guard("freeze policy", step, strict=self.options.strict, recover=False)
            if (froze := freeze(self.freezer, min_over_ranks, guard)) is not None:
                self._record(FREEZE_KIND, step, "info", *froze)
        if (budget := self.options.overhead_budget) is not None:  # the longest interval any rank asks for
            change = self._clock.fit(self.interval, sample.overhead_ratio, budget, lambda n: int(max_over_ranks(n)))
            if change is not None:
                self.interval = change.interval
                self._record(INTERVAL_KIND, step, "info", change.message(), change.record_data())
                if self.faults.echo and (warning := change.warning(step)):
                    to_stderr(warning)

    def _record(self, kind: str, step: int, severity: str, message: str, data: dict[str, Any] | None = None) -> None:
        """Dispatch an action record (``early_stop``, ``blocks_frozen``, ``sampling_interval``) to every sink."""
        self.alerts.dispatch(Alert(kind, step, time.time(), self.run, severity, message, data or {}))

    def _context(self) -> SampleContext:
        return SampleContext(self.run, tuple(self.history), self.tracker.onset_step, frozenset(self.alerts.active),
                             dict(self.alerts.opened), self.should_stop)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume alerts, onset tracking and early stopping (not the history)."""
        reached = max((s for s in (self._seen_step, self.last_step) if s is not None), default=None)
        policies = Policies(self.tracker, self.stoppers, self.plateau_stopper)
        folder = self._loaded_folder if self.run_dir is None else \
            Path(os.path.relpath(self.run_dir, self.options.log_dir or "")).as_posix()
        return SavedState(self.run, reached, self.last_step, self.should_stop, self.stop_reason, policies, self.alerts,
                          list(self.rules.stall), self.interval, self.freezer.state_dict() if self.freezer else None,
                          folder).to_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore [`state_dict`][isiwatch.Watch.state_dict]'s output, all or nothing: the whole state is validated (and
        loaded into fresh policies) before anything is assigned, so a bad state raises ``ValueError`` naming the field
        and leaves the Watch as it was. The resumed run writes on in its own folder (`run_dir`) unless
        ``run_folder`` names one: the folder this Watch created is removed when it holds no record yet. A run folder
        another Watch writes raises `FolderInUse` (a ``ValueError``)."""
        saved = read_state(state, self.options, self.run)
        target = resumed_dir(self.options.log_dir, self.options.run_folder, self.run_dir, saved.run_folder)
        lock = LogFolderLock(target, saved.alerts.run) if target is not None else None  # refused: nothing assigned
        try:
            if self.freezer is not None and saved.freezer is not None:  # it checks its state before freezing anything
                self.freezer.load_state_dict(saved.freezer, "Watch state['freezer']")
        except BaseException:
            if lock is not None:
                lock.release()
            raise
        if target is not None and lock is not None:
            self._continue_in(target, lock, saved.alerts.run)
        self._loaded_folder = saved.run_folder
        if saved.alerts.run != self.run:
            self.run = self.alerts.run = saved.alerts.run
            self._fanout.each("rename", self.run)
        self.last_step, self.should_stop, self.stop_reason = saved.last_step, saved.should_stop, saved.stop_reason
        self.tracker, self.stoppers, self.plateau_stopper = saved.policies
        resume_alerts(self.alerts, saved.alerts)
        self.interval = saved.interval
        self.rules.stall.clear()
        self.rules.stall.extend(saved.isi_stall)
        if saved.step is not None:  # what a crashed run logged after the checkpoint goes: the resumed run logs it anew
            self._fanout.each("resume", saved.run, saved.step)

    def _continue_in(self, run_dir: Path, lock: LogFolderLock, run: str) -> None:
        """Write the run folder ``run_dir`` (a resumed run's, its ``lock`` taken) from now on: its own exporters
        replace the ones of the folder this Watch created, which goes when it holds no record."""
        moved = folder_exporters(run_dir, run, self.options.heatmap_every, lock)
        old, self._in_run_dir = self._in_run_dir, moved
        self._fanout.each("close", SampleContext(run, (), None, frozenset(), {}, False), among=old)
        if self.options.run_folder is None and self.run_dir is not None:
            discard_unused(self.run_dir)
        self.exporters = [moved[old.index(e)] if e in old else e for e in self.exporters]
        self.run_dir = run_dir
        self._fanout.each("open", among=moved)

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
        self._fanout.each("close", self._context())
        self.exporters = []

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(final_sample=exc_type is None)  # no probe pass on a model an exception left behind
