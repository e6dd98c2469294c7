"""What the framework integrations share: a Watch created once the framework hands over the model, the
summary a framework's own logger receives, and the training loss read from a model's output."""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from isiwatch.watch.monitor import Watch


def require_extra(extra: str, *modules: str) -> None:
    """Import ``modules`` or raise one line naming the extra that installs them: a user of an integration sees
    ``pip install "isiwatch[transformers]"``, not a ``ModuleNotFoundError`` from inside isiwatch (the Trainer also
    needs ``accelerate``, which transformers itself does not install)."""
    missing = []
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise ModuleNotFoundError(f"isiwatch's {extra} integration needs {' and '.join(missing)}, not installed: "
                                  f'pip install "isiwatch[{extra}]"', name=missing[0])


def loss_value(output: Any) -> Tensor | float | None:
    """The training loss in a step's output: a scalar tensor or number, or the ``"loss"`` entry of a dict
    (Lightning's ``training_step`` result, a transformers ``ModelOutput``, a timm task result); logits and
    other outputs give None."""
    if isinstance(output, Mapping):
        output = output.get("loss")
    if isinstance(output, Tensor):
        return output.detach() if output.numel() == 1 else None
    return output if isinstance(output, (int, float)) else None


class LossTap:
    """The training loss of the last optimizer step, read from a module's outputs through a forward hook, for
    loops that do not hand the loss to their callbacks (transformers' Trainer, timm's train.py).

    Under gradient accumulation a step has several forwards; `take` combines their losses as the loop
    itself reports them: summed when the loop passed ``num_items_in_batch`` (transformers then divides each
    micro-batch's summed loss by the tokens of the whole step, so each is a partial sum), else averaged.
    Outputs without a loss (the probe pass, plain logits) and forwards in eval mode (an evaluation loop) are
    ignored; the losses are added as tensors, converted only on sampling steps."""

    def __init__(self, module: nn.Module):
        self._total: Tensor | float | None = None
        self._forwards = 0
        self._partial = False
        self._last: Tensor | float | None = None
        self._handle = module.register_forward_hook(self._keep, with_kwargs=True)

    def _keep(self, module: nn.Module, _args: Any, kwargs: dict[str, Any], output: Any) -> None:
        loss = loss_value(output)
        if loss is None or not module.training:
            return
        self._total = loss if self._total is None else self._total + loss
        self._forwards += 1
        self._partial = kwargs.get("num_items_in_batch") is not None

    def take(self) -> Tensor | float | None:
        """The loss of the optimizer step that just ended, and a fresh start for the next; a step without a
        training forward (none seen since the last call) repeats the last value."""
        if self._total is not None:
            total, forwards = self._total, self._forwards
            self._last = total if self._partial or forwards == 1 else total / forwards
            self._total, self._forwards = None, 0
        return self._last

    def remove(self) -> None:
        self._handle.remove()


def logged_series(watch: Watch) -> dict[str, float]:
    """The last sample as a framework logger gets it: the ``last``/``mean`` of every metric, the plateau and
    the loss, named ``isiwatch/<series>``, finite values only. Per-layer curves go to isiwatch's own
    exporters; a logger that prints its records (transformers' progress bar) stays readable."""
    series = watch.history[-1].series()
    return {f"isiwatch/{name}": value for name, value in series.items()
            if "/layer_" not in name and math.isfinite(value)}


class WatchSlot:
    """Holds the options until the framework hands over the model, then one ``Watch`` per run.

    State restored before the Watch exists (Lightning restores callbacks before ``on_fit_start``) waits
    until it does. Closing keeps the state, so a second ``fit``/``train`` continues where the first ended,
    and keeps the closed Watch for its ``history``, ``should_stop`` and ``stop_reason``.
    """

    def __init__(self, probe_images: Tensor, probe_labels: Tensor | None, watch_options: dict[str, Any]):
        self.probe_images, self.probe_labels, self.watch_options = probe_images, probe_labels, watch_options
        self.watch: Watch | None = None
        self._open = False
        self._state: dict[str, Any] | None = None

    def open(self, model: nn.Module) -> Watch:
        if not self._open:
            self.watch = Watch(model, self.probe_images, self.probe_labels, **self.watch_options)
            self._open = True
            if self._state is not None:
                self.watch.load_state_dict(self._state)
        return self.opened

    @property
    def opened(self) -> Watch:
        """The Watch of the run (created by `open`; the framework calls ``open`` before any step)."""
        if self.watch is None:
            raise RuntimeError("isiwatch: the framework stepped before it handed over the model")
        return self.watch

    def step(self, global_step: int, loss: Tensor | float | None) -> dict[str, float] | None:
        """``Watch.step``; returns the logger summary when this call sampled, else None."""
        watch = self.opened
        before = watch.last_step
        watch.step(global_step, loss)
        return logged_series(watch) if watch.last_step != before else None

    def finish(self) -> dict[str, float] | None:
        """``Watch.finish`` (the final sample, if the last step was not sampled), while the framework's loggers
        are open; returns the logger summary when it sampled, else None."""
        watch = self.opened
        before = watch.last_step
        watch.finish()
        return logged_series(watch) if watch.last_step != before else None

    def state_dict(self) -> dict[str, Any] | None:
        return self.opened.state_dict() if self._open else self._state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._state = state
        if self._open:
            self.opened.load_state_dict(state)

    def close(self, final_sample: bool = True) -> None:
        """``Watch.close``: the final sample unless ``final_sample`` is False (after an exception)."""
        if self._open:
            self.opened.close(final_sample=final_sample)
            self._state = self.opened.state_dict()
            self._open = False
