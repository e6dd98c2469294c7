"""FLOPs of what a function runs, counted by ``torch.utils.flop_counter``: one counter for the cost of a cut
(``truncation.cost``) and of a training step with frozen blocks (``watch.freezing``)."""

from __future__ import annotations

from collections.abc import Callable

from torch.utils.flop_counter import FlopCounterMode


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs (multiply-add = 2) of everything ``fn`` runs, forward and backward, as counted by
    ``FlopCounterMode`` (matmuls, convolutions and attention; element-wise ops are not counted)."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())
