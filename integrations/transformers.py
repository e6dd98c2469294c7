"""isiwatch as a Hugging Face ``transformers`` TrainerCallback."""

from __future__ import annotations

from typing import Any

from isiwatch.integrations.common import LossTap, WatchSlot
from torch import Tensor, nn
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import ExportableState

from isiwatch.monitor import Watch


class ISIWatchCallback(TrainerCallback, ExportableState):
    """Samples the Trainer's model every ``every_n_steps`` optimizer steps (``state.global_step``), and once more
    at the end of the last epoch if the last step was not sampled.

    ``watch_options`` are :class:`isiwatch.Watch`'s keyword arguments. On a sampling step the callback asks
    the Trainer to log and adds the ``isiwatch/*`` summary to that step's logs (and ``state.log_history``);
    the full curves go to isiwatch's own exporters. The Trainer calls its reporting callbacks (TensorBoard,
    W&B, ...) before user callbacks, so attach with :func:`add_callback` for the reporters to see the
    summary. A stop request sets ``control.should_training_stop``. The Watch state is saved in
    ``trainer_state.json`` (``ExportableState``) and restored on ``train(resume_from_checkpoint=...)``.
    """

    def __init__(self, probe_images: Tensor, probe_labels: Tensor | None = None, **watch_options: Any):
        self.slot = WatchSlot(probe_images, probe_labels, watch_options)
        self._loss: LossTap | None = None
        self._summary: dict[str, float] | None = None

    @property
    def watch(self) -> Watch | None:
        return self.slot.watch

    def state(self) -> dict:
        return {"args": {}, "attributes": {"watch_state": self.slot.state_dict()}}

    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        if args.restore_callback_states_from_checkpoint:
            raise ValueError("ISIWatchCallback cannot be rebuilt from JSON (it holds a probe batch): leave "
                             "restore_callback_states_from_checkpoint=False; it restores its own state on resume")

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: nn.Module | None = None, **kwargs) -> None:
        self.slot.open(model)
        saved = (state.stateful_callbacks or {}).get(type(self).__name__)
        if isinstance(saved, dict) and saved["attributes"].get("watch_state"):
            self.slot.load_state_dict(saved["attributes"]["watch_state"])
        self._loss = LossTap(model)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        self._log(control, self.slot.step(state.global_step, self._loss.value))
        if self.watch.should_stop:
            control.should_training_stop = True

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        # The final sample here rather than in on_train_end: the Trainer loads the best checkpoint
        # (load_best_model_at_end) before on_train_end, and logs once more after this event.
        if control.should_training_stop:
            self._log(control, self.slot.finish())

    def _log(self, control: TrainerControl, summary: dict[str, float] | None) -> None:
        if summary is not None:
            self._summary = summary
            control.should_log = True

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, float] | None = None, **kwargs) -> None:
        if self._summary is None or logs is None:
            return
        logs.update(self._summary)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(self._summary)
        self._summary = None

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        self._loss.remove()
        self.slot.close()


def add_callback(trainer: Trainer, callback: ISIWatchCallback) -> None:
    """Put ``callback`` first in the Trainer's callbacks. ``Trainer(callbacks=...)`` and ``add_callback`` place
    user callbacks after the reporting ones, which would log each step before isiwatch adds its summary."""
    handler = trainer.callback_handler
    if callback in handler.callbacks:
        handler.callbacks.remove(callback)
    handler.callbacks.insert(0, callback)
