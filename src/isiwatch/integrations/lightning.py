"""isiwatch as a Lightning callback (``lightning.pytorch``)."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from isiwatch.integrations.common import WatchSlot, loss_value, require_extra
from isiwatch.watch.monitor import Watch

from ..taps import TapError, vit_parts

require_extra("lightning", "lightning")

import lightning.pytorch as pl  # noqa: E402


def network(pl_module: pl.LightningModule) -> nn.Module:
    """The ViT a LightningModule trains: its first child in which isiwatch finds ViT blocks (the probe pass
    calls it on images, which the LightningModule's own ``forward`` need not accept), else the module."""
    for child in pl_module.children():
        try:
            vit_parts(child)
        except TapError:
            continue
        return child
    return pl_module


class ISIWatchCallback(pl.Callback):
    """Samples the LightningModule's ViT (`network`) every ``every_n_steps`` optimizer steps
    (``trainer.global_step``, read on the batch that completes an optimizer step, so under gradient accumulation
    neither step 0 nor the accumulating batches), and once more at the end of training if the last step was
    not sampled.

    ``watch_options`` are [`isiwatch.Watch`][isiwatch.Watch]'s keyword arguments (``every_n_steps``, ``log_dir``,
    ``monitor``, ``stop_on_plateau``, ``config``, ...). On each sample the ``isiwatch/*`` summary goes to every
    logger of the trainer and the full curves to isiwatch's own exporters; a stop request sets
    ``trainer.should_stop``, which Lightning honours after the current batch (every rank decides the same
    under DDP, since Watch agrees on the decision). The Watch state lives in the Lightning checkpoint.
    """

    def __init__(self, probe_images: Tensor, probe_labels: Tensor | None = None, **watch_options: Any):
        self.slot = WatchSlot(probe_images, probe_labels, watch_options)
        self._step_before_batch: int | None = None

    @property
    def watch(self) -> Watch | None:
        return self.slot.watch

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        watch = self.slot.open(network(pl_module))
        # Lightning's automatic optimization hands over the training_step loss divided by the accumulation
        # factor (ClosureResult, lightning 2.x): the Watch scales it back when it samples, not on every step
        if pl_module.automatic_optimization:
            watch.loss_scale = float(trainer.accumulate_grad_batches)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._step_before_batch = trainer.global_step

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if trainer.global_step == self._step_before_batch:
            return  # an accumulating batch: no optimizer step
        self._log(trainer, self.slot.step(trainer.global_step, loss_value(outputs)), _batch_log_step(trainer))
        if self.slot.opened.should_stop:
            trainer.should_stop = True

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # the final sample here, not at teardown: the loggers are still open and the model still on its device
        self._log(trainer, self.slot.finish(), _batch_log_step(trainer) - 1)  # the last batch's, already counted

    def _log(self, trainer: pl.Trainer, summary: dict[str, float] | None, step: int) -> None:
        if summary is not None:
            for logger in trainer.loggers:
                logger.log_metrics(summary, step=step)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.slot.close()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.slot.close(final_sample=False)  # no probe pass on a model an exception left behind

    def state_dict(self) -> dict[str, Any]:
        return self.slot.state_dict() or {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict:
            self.slot.load_state_dict(state_dict)


def _batch_log_step(trainer: pl.Trainer) -> int:
    """The step under which Lightning's loggers file the current batch's ``self.log`` values (its training loop's
    count of batches that stepped the optimizer before this one; ``global_step`` is already one further on
    ``on_train_batch_end``), so ``isiwatch/loss`` lands on the same step as the module's own ``train_loss``."""
    stepped = getattr(trainer.fit_loop.epoch_loop, "_batches_that_stepped", None)  # lightning 2.x
    return stepped if isinstance(stepped, int) else trainer.global_step - 1
