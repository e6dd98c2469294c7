"""isiwatch as a Lightning callback (``lightning.pytorch``)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from isiwatch.integrations.common import WatchSlot, loss_value
from torch import Tensor, nn

from isiwatch import TapError, vit_parts
from isiwatch.monitor import Watch


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
    """Samples the LightningModule's ViT (:func:`network`) every ``every_n_steps`` optimizer steps
    (``trainer.global_step``).

    ``watch_options`` are :class:`isiwatch.Watch`'s keyword arguments (``every_n_steps``, ``log_dir``,
    ``monitor``, ``stop_on_plateau``, ``config``, ...). On each sample the ``isiwatch/*`` summary goes to every
    logger of the trainer and the full curves to isiwatch's own exporters; a stop request sets
    ``trainer.should_stop``, which Lightning honours after the current batch (every rank decides the same
    under DDP, since Watch agrees on the decision). The Watch state lives in the Lightning checkpoint.
    """

    def __init__(self, probe_images: Tensor, probe_labels: Tensor | None = None, **watch_options: Any):
        self.slot = WatchSlot(probe_images, probe_labels, watch_options)

    @property
    def watch(self) -> Watch | None:
        return self.slot.watch

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.slot.open(network(pl_module))

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        summary = self.slot.step(trainer.global_step, loss_value(outputs))
        if summary is not None:
            for logger in trainer.loggers:
                logger.log_metrics(summary, step=trainer.global_step)
        if self.watch.should_stop:
            trainer.should_stop = True

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.slot.close()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.slot.close()

    def state_dict(self) -> dict[str, Any]:
        return self.slot.state_dict() or {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict:
            self.slot.load_state_dict(state_dict)
