"""isiwatch in timm's ``train.py`` with a two-line patch (see README, Integrations).

train.py calls ``optimizer.step()`` once per update and wraps its epoch loop in ``try: ... except
KeyboardInterrupt``, so `TrainScriptWatch` needs no edit of the loop itself: an optimizer step
hook counts updates and samples, a forward hook on the task reads the loss, and a stop request raises
`StopTraining` (a ``KeyboardInterrupt``) on every rank at the same update.
"""

from __future__ import annotations

import argparse
import atexit
import copy
import os
import random
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from itertools import islice
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, IterableDataset

from isiwatch.integrations.common import LossTap
from isiwatch.watch.monitor import Watch

#: Where the Watch state sits in the optimizer's state dict (``checkpoint["optimizer"][STATE_KEY]``).
STATE_KEY = "isiwatch"


def saved_watch_state(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The Watch state a train.py checkpoint carries (`TrainScriptWatch`), or None when it has none (a
    checkpoint written without isiwatch). Loaded with ``weights_only=True`` (train.py's ``args`` Namespace
    allowed, as timm does) and memory-mapped, so the tensors are not read."""
    with torch.serialization.safe_globals([argparse.Namespace]):
        try:
            checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # not a zip-format file: mmap is impossible
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    optimizer = checkpoint.get("optimizer") if isinstance(checkpoint, dict) else None
    return optimizer.get(STATE_KEY) if isinstance(optimizer, dict) else None


class StopTraining(KeyboardInterrupt):
    """isiwatch asked to stop. A ``KeyboardInterrupt`` so that train.py leaves its epoch loop the way it does
    on Ctrl-C: it still tears down the process group and prints its results (no checkpoint is written for
    the interrupted epoch; the best ones saved so far stay)."""


def probe_batch(loader: Iterable[Any], count: int = 256) -> tuple[Tensor, Tensor]:
    """The first ``count`` images and labels of a timm loader (train.py's ``loader_eval``): eval transforms,
    normalised (by the prefetcher when there is one), on the loader's device. Under DDP each rank reads its
    own shard of the eval set; the stop decision is agreed all the same.

    Training is not perturbed: the loader is read without its own iterator (`_batches`) and the torch
    (CPU, current CUDA device), Python and numpy RNG states are restored afterwards."""
    images, labels, seen = [], [], 0
    with _rng_restored():
        for batch_images, batch_labels in _batches(loader):
            images.append(batch_images)
            labels.append(batch_labels)
            seen += len(batch_images)
            if seen >= count:
                break
    return torch.cat(images)[:count], torch.cat(labels)[:count]


def _batches(loader: Iterable[Any]) -> Iterator[Any]:
    """The loader's batches, read in this process through its batch sampler, dataset and collate function (and
    timm's ``PrefetchLoader`` normalisation, on a copy). Not through the DataLoader's iterator: creating one draws
    a seed from the global torch RNG, and a persistent-worker (timm's default) or multi-epoch loader keeps it,
    so train.py's first validation would then draw nothing and start later epochs from a different RNG state."""
    inner = getattr(loader, "loader", loader)  # timm's PrefetchLoader wraps a DataLoader
    if not isinstance(inner, DataLoader) or inner.batch_sampler is None:
        return iter(loader)
    batches: Iterator[Any]
    if isinstance(inner.dataset, IterableDataset):  # no indices: a worker-less loader of its own
        batches = iter(DataLoader(inner.dataset, batch_size=inner.batch_size, collate_fn=inner.collate_fn))
    else:  # len(inner) bounds timm's endlessly repeating multi-epoch batch sampler
        batches = (inner.collate_fn([inner.dataset[i] for i in indices])
                   for indices in islice(inner.batch_sampler, len(inner)))
    if inner is loader:
        return batches
    prefetcher = copy.copy(loader)
    prefetcher.loader = batches  # type: ignore[attr-defined]  # timm's PrefetchLoader (checked above)
    return iter(prefetcher)


@contextmanager
def _rng_restored() -> Iterator[None]:
    """Restores the global torch (CPU and, if initialised, the current CUDA device), Python and numpy RNGs."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    cuda = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []  # type: ignore[no-untyped-call]
    try:
        with torch.random.fork_rng(devices=cuda, device_type="cuda"):
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


class TrainScriptWatch:
    """A [`isiwatch.Watch`][isiwatch.Watch] on ``task``'s trainable module, sampled after every ``optimizer`` step.

    ``task``: a timm ``TrainingTask`` (train.py ≥ 1.0.2x; its output dict carries the loss) or the model
    itself (older train.py; no loss then). ``start_step``: updates already done when resuming
    (``start_epoch * updates_per_epoch``), so sampling steps continue the run's numbering. Optimizer steps
    that a ``GradScaler`` skips (non-finite gradients) are not counted. Closes itself when it stops the run
    and at interpreter exit; closing samples the last update if it was not sampled (``Watch.close``).

    The Watch state (run name, alert episodes, onset tracking, early stopping) rides in the optimizer's state
    dict under `STATE_KEY`, so every checkpoint train.py's ``CheckpointSaver`` writes carries it, and
    ``resume`` (train.py's ``args.resume``: a checkpoint path, or empty) restores it: the resumed run keeps its
    name and its open episodes. (train.py restores the optimizer before the patch runs, so the state is read
    from the file, ``weights_only``.)
    """

    def __init__(self, task: nn.Module, optimizer: torch.optim.Optimizer, probe_images: Tensor,
                 probe_labels: Tensor | None = None, *, start_step: int = 0,
                 resume: str | os.PathLike[str] | None = None,
                 **watch_options: Any):
        trainable = getattr(task, "get_trainable_module", None)
        model = trainable() if callable(trainable) else task
        self.watch = Watch(model, probe_images, probe_labels, **watch_options)
        if resume:
            state = saved_watch_state(resume)
            if state is not None:
                self.watch.load_state_dict(state)
        self.num_updates = start_step
        self._loss = LossTap(task)
        self._step_hook = optimizer.register_step_post_hook(self._after_step)
        self._state_hook = optimizer.register_state_dict_post_hook(self._add_state)
        atexit.register(self.close)

    def _add_state(self, _optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> dict[str, Any]:
        state[STATE_KEY] = self.watch.state_dict()
        return state

    def _after_step(self, _optimizer: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        self.num_updates += 1
        self.watch.step(self.num_updates, self._loss.take())
        if self.watch.should_stop:
            self.close()
            raise StopTraining(self.watch.stop_reason)

    def close(self) -> None:
        """Remove the hooks and close the Watch's exporters (idempotent)."""
        atexit.unregister(self.close)
        self._step_hook.remove()
        self._state_hook.remove()
        self._loss.remove()
        self.watch.close()
