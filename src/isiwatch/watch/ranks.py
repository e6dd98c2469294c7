"""Rank agreement under torch.distributed: every rank of a job reaches the same decision.

Each function is one all-reduce when a process group is initialised and the identity otherwise. Call one on every
rank at the same point of the same sample, never between samples, where it could meet the model's own collectives.
"""

from __future__ import annotations

import torch


def distributed() -> bool:
    """Whether this process is one rank of an initialised torch.distributed job."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def rank() -> int:
    """This process's rank (0 outside torch.distributed)."""
    return torch.distributed.get_rank() if distributed() else 0


def max_over_ranks(value: float) -> float:
    """The largest ``value`` over all ranks (reduced as a float)."""
    if not distributed():
        return value
    device = "cuda" if torch.distributed.get_backend() == "nccl" else "cpu"
    tensor = torch.tensor([float(value)], device=device)
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
    return float(tensor.item())


def min_over_ranks(value: int) -> int:
    """The smallest ``value`` over all ranks."""
    return int(-max_over_ranks(-float(value)))


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` is set on any rank."""
    return bool(max_over_ranks(float(flag)))
