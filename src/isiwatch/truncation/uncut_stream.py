"""The uncut model's residual stream on the calibration images, kept between the cuts a search bridges, and cuts
run from it.

Every cut of an ``auto`` search is bridged and judged on the same calibration images against the same uncut
model. A cut keeps the uncut model's first blocks until its first dropped one, so up to there it computes what
the uncut model computes: it runs from the stored stream (`resumed`; the blocks before pass it on without
computing) and pays only for the blocks after. The stream entering each block is stored once, on the CPU, for at
most `STORE_BYTES` (least recently used first out), so fitting and choosing a bridge for a candidate costs a few
blocks instead of passes through both models.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from ..taps.tap import preserved_state
from .classifier_layout import block_list, logits

__all__ = ["BATCH", "STORE_BYTES", "UncutStream", "resumed"]

#: Calibration images per forward pass.
BATCH = 128
#: Most bytes of stored stream (CPU memory); the streams a cut needs are kept even beyond it.
STORE_BYTES = 1 << 30


class _Stop(Exception):
    """Raised by a hook that ends a forward pass once what it needs is captured."""


def until(model: nn.Module, images: Tensor) -> None:
    """Run ``model`` on ``images`` up to the hook that raises `_Stop` (the later blocks cost nothing)."""
    try:
        model(images)
    except _Stop:
        pass


def first(output: Any) -> Tensor:
    """The hidden states of a block's output (transformers blocks return a tuple)."""
    result: Tensor = output[0] if isinstance(output, tuple) else output
    return result


@contextmanager
def capture(module: nn.Module, store: list[Tensor], stop: bool = False) -> Iterator[None]:
    """Append ``module``'s output to ``store`` on every forward; with ``stop``, end the pass there (`until`)."""
    def hook(_module: nn.Module, _inputs: Any, out: Any) -> None:
        store.append(first(out).detach())
        if stop:
            raise _Stop

    handle = module.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def batches(images: Tensor) -> Iterator[Tensor]:
    """``images`` in slices of `BATCH`: the stream is stored per slice."""
    for start in range(0, len(images), BATCH):
        yield images[start:start + BATCH]


def _hidden(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
    """The hidden states a block is called with (first positional argument, or transformers' keyword)."""
    hidden: Tensor = args[0] if args else kwargs["hidden_states"]
    return hidden


class UncutStream:
    """The stream of ``uncut`` entering each of its blocks (index ``depth``: leaving the last one) on the
    calibration ``images``, per `BATCH` slice, and its predictions on them: all from one pass on first use, a
    stream evicted since from a pass up to its block."""

    def __init__(self, uncut: nn.Module, images: Tensor, store_bytes: int = STORE_BYTES):
        self.uncut, self.images, self.store_bytes = uncut, images, store_bytes
        self.depth = len(block_list(uncut))
        self._stored: OrderedDict[int, list[Tensor]] = OrderedDict()
        self._tuples: dict[int, bool] = {}  # block index -> whether it returns a tuple
        self._reference: Tensor | None = None

    @property
    def reference(self) -> Tensor:
        """The uncut model's predictions on the calibration images."""
        if self._reference is None:
            self._fill(self.depth, predict=True)
        assert self._reference is not None  # filled by that pass
        return self._reference

    def entering(self, index: int) -> list[Tensor]:
        """The uncut stream entering block ``index`` (``depth``: leaving the last block), per slice, on the CPU."""
        if index not in self._stored:
            self._fill(index)
        self._stored.move_to_end(index)
        return self._stored[index]

    def returns_tuple(self, index: int) -> bool:
        """Whether uncut block ``index`` returns a tuple (known once the stream entering a later block is)."""
        return self._tuples[index]

    def _fill(self, index: int, predict: bool = False) -> None:
        """One pass of the uncut model storing the stream entering each block it runs: the first pass runs the
        whole model (every block's stream; with ``predict``, the predictions too), a later one stops at block
        ``index``."""
        whole = predict or not self._stored
        last = self.depth if whole else index
        wanted: dict[int, list[Tensor]] = {i: [] for i in range(last + 1) if i not in self._stored}

        def entering_hook(i: int) -> Any:
            def hook(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
                if i in wanted:
                    wanted[i].append(_hidden(args, kwargs).detach().cpu())
                if i == last:
                    raise _Stop
            return hook

        def leaving_hook(i: int) -> Any:
            def hook(_module: nn.Module, _args: Any, out: Any) -> None:
                self._tuples[i] = isinstance(out, tuple)
                if i + 1 == self.depth and self.depth in wanted:
                    wanted[self.depth].append(first(out).detach().cpu())
            return hook

        blocks = block_list(self.uncut)
        handles = [hook for i, block in enumerate(blocks) for hook in (
            block.register_forward_pre_hook(entering_hook(i), with_kwargs=True),
            block.register_forward_hook(leaving_hook(i)))]
        device = next(self.uncut.parameters()).device
        predictions = []
        try:
            with preserved_state(self.uncut), torch.no_grad():
                self.uncut.eval()
                for batch in batches(self.images):
                    if predict:
                        predictions.append(logits(self.uncut(batch.to(device))).argmax(-1).cpu())
                    else:
                        until(self.uncut, batch.to(device))  # the whole model when no hook stops it
        finally:
            for handle in handles:
                handle.remove()
        if predict:
            self._reference = torch.cat(predictions)
        self._stored.update(wanted)
        self._evict(keep=index)

    def _evict(self, keep: int) -> None:
        """Drop the least recently used streams (never ``keep``) while more than `store_bytes` are stored."""
        def size() -> int:
            return sum(t.numel() * t.element_size() for slices in self._stored.values() for t in slices)

        while size() > self.store_bytes and len(self._stored) > 1:
            oldest = next(i for i in self._stored if i != keep)
            del self._stored[oldest]

    def predictions(self, cut: nn.Module, position: int) -> Tensor:
        """``cut``'s predictions on the calibration images, run from the stream entering its block ``position``
        (its blocks before ``position`` must be the uncut model's first ones, unchanged)."""
        device = next(cut.parameters()).device
        out = []
        with preserved_state(cut), torch.no_grad():
            cut.eval()
            for batch, entry in zip(batches(self.images), self.entering(position), strict=True):
                with resumed(cut, position, entry.to(device), self):
                    out.append(logits(cut(batch.to(device))).argmax(-1).cpu())
        return torch.cat(out)


@contextmanager
def resumed(cut: nn.Module, position: int, entry: Tensor, stream: UncutStream) -> Iterator[None]:
    """While inside, ``cut``'s blocks before ``position`` compute nothing and its block ``position`` receives
    ``entry`` (the uncut stream entering it, for the batch about to run): each skipped block returns its input
    in the form it normally returns."""
    blocks = list(block_list(cut))[:position]

    def passthrough(i: int) -> Any:
        def forward(*args: Any, **kwargs: Any) -> Any:
            hidden = entry if i == position - 1 else _hidden(args, kwargs)
            return (hidden,) if stream.returns_tuple(i) else hidden
        return forward

    try:
        for i, block in enumerate(blocks):
            block.forward = passthrough(i)
        yield
    finally:
        for block in blocks:
            block.__dict__.pop("forward", None)
