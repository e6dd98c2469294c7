"""The host–device transfers of a sample: one read of every number it computed, and constants copied once.

Taps, metrics and probes leave their results on the model's device; `read_back` flattens them into one float64
tensor (float32 on Apple's MPS, which has no float64) and copies it to the host in one transfer (on CUDA into
pinned memory, non-blocking, then one wait), so a sample synchronises with the device once, not once per value.
Phases, alerts, early stopping, the freeze policy and the exporters then work on the host numbers. The other way,
a blocking copy of a constant (a list of regularisers, column indices) synchronises too, so `on_device` makes each
one once per device and keeps it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

import torch
from torch import Tensor
from torch.profiler import record_function


def read_back(values: Mapping[str, Tensor]) -> dict[str, list[float]]:
    """Each tensor of ``values`` as a flat list of Python floats, from one host read of all of them."""
    if not values:
        return {}
    device = next(iter(values.values())).device
    dtype = torch.float32 if device.type == "mps" else torch.float64  # MPS has no float64; values are fp32 there
    # joined in their own dtypes (cat promotes to the widest, exactly) and converted once: a copy per value cost
    # three ops each
    flat = [(v if v.dim() == 1 else v.reshape(-1)) if v.device == device else v.reshape(-1).to(device)
            for v in values.values()]
    sizes = [len(v) for v in flat]
    with record_function("isiwatch.host"), torch.no_grad():
        joined = torch.cat(flat).to(dtype)
        if joined.device.type == "cuda":
            host = torch.empty(joined.shape, dtype=joined.dtype, pin_memory=True)
            host.copy_(joined, non_blocking=True)
            torch.cuda.current_stream(joined.device).synchronize()
        else:
            host = joined.cpu()
        numbers = host.tolist()
    out, start = {}, 0
    for name, size in zip(values, sizes):
        out[name] = numbers[start:start + size]
        start += size
    return out


@functools.lru_cache(maxsize=64)
def on_device(values: tuple[float, ...] | tuple[int, ...], device: torch.device, dtype: torch.dtype) -> Tensor:
    """``values`` as a 1-D tensor on ``device``, copied there once and kept (callers must not write to it)."""
    return torch.tensor(values, dtype=dtype).to(device)
