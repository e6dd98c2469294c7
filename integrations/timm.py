"""isiwatch in timm's ``train.py`` with a two-line patch (see README, Integrations).

train.py calls ``optimizer.step()`` once per update and wraps its epoch loop in ``try: ... except
KeyboardInterrupt``, so :class:`TrainScriptWatch` needs no edit of the loop itself: an optimizer step
hook counts updates and samples, a forward hook on the task reads the loss, and a stop request raises
:class:`StopTraining` (a ``KeyboardInterrupt``) on every rank at the same update.
"""

from __future__ import annotations

import atexit
from collections.abc import Iterable
from typing import Any

import torch
from isiwatch.integrations.common import LossTap
from torch import Tensor, nn

from isiwatch.monitor import Watch


class StopTraining(KeyboardInterrupt):
    """isiwatch asked to stop. A ``KeyboardInterrupt`` so that train.py leaves its epoch loop the way it does
    on Ctrl-C: it still tears down the process group and prints its results (no checkpoint is written for
    the interrupted epoch; the best ones saved so far stay)."""


def probe_batch(loader: Iterable, count: int = 256) -> tuple[Tensor, Tensor]:
    """The first ``count`` images and labels of a timm loader (train.py's ``loader_eval``): eval transforms,
    normalised (by the prefetcher when there is one), on the loader's device. Under DDP each rank reads its
    own shard of the eval set; the stop decision is agreed all the same."""
    images, labels, seen = [], [], 0
    for batch_images, batch_labels in loader:
        images.append(batch_images)
        labels.append(batch_labels)
        seen += len(batch_images)
        if seen >= count:
            break
    return torch.cat(images)[:count], torch.cat(labels)[:count]


class TrainScriptWatch:
    """A :class:`isiwatch.Watch` on ``task``'s trainable module, sampled after every ``optimizer`` step.

    ``task``: a timm ``TrainingTask`` (train.py ≥ 1.0.2x; its output dict carries the loss) or the model
    itself (older train.py; no loss then). ``start_step``: updates already done when resuming
    (``start_epoch * updates_per_epoch``), so sampling steps continue the run's numbering. Optimizer steps
    that a ``GradScaler`` skips (non-finite gradients) are not counted. Closes itself when it stops the run
    and at interpreter exit.
    """

    def __init__(self, task: nn.Module, optimizer: torch.optim.Optimizer, probe_images: Tensor,
                 probe_labels: Tensor | None = None, *, start_step: int = 0, **watch_options: Any):
        model = task.get_trainable_module() if hasattr(task, "get_trainable_module") else task
        self.watch = Watch(model, probe_images, probe_labels, **watch_options)
        self.num_updates = start_step
        self._loss = LossTap(task)
        self._step_hook = optimizer.register_step_post_hook(self._after_step)
        atexit.register(self.close)

    def _after_step(self, _optimizer: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        self.num_updates += 1
        self.watch.step(self.num_updates, self._loss.value)
        if self.watch.should_stop:
            self.close()
            raise StopTraining(self.watch.stop_reason)

    def close(self) -> None:
        """Remove the hooks and close the Watch's exporters (idempotent)."""
        atexit.unregister(self.close)
        self._step_hook.remove()
        self._loss.remove()
        self.watch.close()
