"""isiwatch as a Hugging Face ``transformers`` TrainerCallback."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from torch import Tensor, nn

from isiwatch.integrations.common import LossTap, WatchSlot, require_extra
from isiwatch.watch.monitor import Watch

require_extra("transformers", "transformers", "accelerate")

from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments  # noqa: E402
from transformers.trainer_callback import ExportableState  # noqa: E402

#: The series ``log_summary=True`` adds to the Trainer's logs (those this model has).
SUMMARY_SERIES = ("probe_cls/last", "plateau/length", "recommended_depth")


class ISIWatchCallback(TrainerCallback, ExportableState):
    """Samples the Trainer's model every ``every_n_steps`` optimizer steps (``state.global_step``), and once more
    at the end of the last epoch if the last step was not sampled.

    ``watch_options`` are [`isiwatch.Watch`][isiwatch.Watch]'s keyword arguments; the per-layer curves, alerts and
    summaries go to isiwatch's own exporters (``log_dir``: TensorBoard, ``metrics.jsonl``, ``alerts.jsonl``;
    Prometheus). The Trainer's own logs (its console lines, ``state.log_history`` and its reporters) are left alone
    unless ``log_summary`` asks: ``True`` adds `SUMMARY_SERIES` of the latest sample as ``isiwatch/<series>`` to
    the Trainer's next regular log row (``logging_steps``; no extra rows), a sequence names other series
    (``"isi/mean"``, ``"loss"``, ... from ``watch.series_names``). Reporters (TensorBoard, W&B, ...) run before
    user callbacks, so attach with `add_callback` for them to see it. A stop request sets
    ``control.should_training_stop``. The Watch state is saved in ``trainer_state.json`` (``ExportableState``)
    and restored on ``train(resume_from_checkpoint=...)``.
    """

    def __init__(self, probe_images: Tensor, probe_labels: Tensor | None = None, *,
                 log_summary: bool | Iterable[str] = False, **watch_options: Any):
        if isinstance(log_summary, str):
            raise TypeError("log_summary: True, False or a list of series names, not a string")
        self.slot = WatchSlot(probe_images, probe_labels, watch_options)
        self.log_summary = SUMMARY_SERIES if log_summary is True else tuple(log_summary or ())
        self._loss: LossTap | None = None
        self._summary: dict[str, float] | None = None

    @property
    def watch(self) -> Watch | None:
        return self.slot.watch

    def state(self) -> dict[str, Any]:
        return {"args": {}, "attributes": {"watch_state": self.slot.state_dict()}}

    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        if args.restore_callback_states_from_checkpoint:
            raise ValueError("ISIWatchCallback cannot be rebuilt from JSON (it holds a probe batch): leave "
                             "restore_callback_states_from_checkpoint=False; it restores its own state on resume")

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: nn.Module | None = None, **kwargs: Any) -> None:
        if model is None:
            raise ValueError("ISIWatchCallback needs the model: the Trainer hands it to on_train_begin")
        watch = self.slot.open(model)
        unknown = [name for name in self.log_summary if name not in watch.series_names]
        if unknown and self.log_summary != SUMMARY_SERIES:
            close = difflib.get_close_matches(unknown[0], sorted(watch.series_names), n=1)
            raise ValueError(f"log_summary: {unknown[0]!r} is not a series of this model"
                             + (f"; did you mean {close[0]!r}?" if close else ""))
        callbacks = state.stateful_callbacks
        saved = callbacks.get(type(self).__name__) if isinstance(callbacks, dict) else None
        if isinstance(saved, dict) and saved["attributes"].get("watch_state"):
            self.slot.load_state_dict(saved["attributes"]["watch_state"])
        self._loss = LossTap(model)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        self._log(control, self.slot.step(state.global_step, self._loss.take() if self._loss else None))
        if self.slot.opened.should_stop:
            control.should_training_stop = True

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        # The final sample here rather than in on_train_end: the Trainer loads the best checkpoint
        # (load_best_model_at_end) before on_train_end, and logs once more after this event.
        if control.should_training_stop:
            self._log(control, self.slot.finish())

    def _log(self, control: TrainerControl, summary: dict[str, float] | None) -> None:
        """Keep the asked-for part of a new sample's summary for the Trainer's next log row (no row is forced)."""
        if summary is not None and self.log_summary:
            wanted = {f"isiwatch/{name}" for name in self.log_summary}
            self._summary = {k: v for k, v in summary.items() if k in wanted}

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        if not self._summary or logs is None:
            return
        logs.update(self._summary)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(self._summary)
        self._summary = None

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        if self._loss is not None:
            self._loss.remove()
        self.slot.close()


def add_callback(trainer: Trainer, callback: ISIWatchCallback) -> None:
    """Put ``callback`` first in the Trainer's callbacks. ``Trainer(callbacks=...)`` and ``add_callback`` place
    user callbacks after the reporting ones, which would log each step before isiwatch adds its summary."""
    handler = trainer.callback_handler
    if callback in handler.callbacks:
        handler.callbacks.remove(callback)
    handler.callbacks.insert(0, callback)
