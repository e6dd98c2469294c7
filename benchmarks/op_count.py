"""Counts what a piece of code asks of the device, on the CPU: the CPU proxies of a GPU's launches and syncs.

``OpCount`` is a ``TorchDispatchMode`` that counts every aten op dispatched inside it (on a GPU each op that is not
a view is a kernel launch; views are counted apart) and the sync-capable ones: the ops that read a value on the host
(``.item()``, ``bool()``, ``int()``, ``float()``: ``_local_scalar_dense``), data-dependent shapes (``nonzero``,
``unique``, ``masked_select``) and linalg calls that check their result on the host (``eigh``, ``svd``, ``solve`` and
friends without ``_ex``). Host reads that never dispatch on the CPU (``.tolist()``, ``.numpy()``, ``.cpu()`` of a CPU
tensor) are counted by a ``TorchFunctionMode`` beside it. Deterministic on the CPU, whatever the machine's load.
"""

from __future__ import annotations

import collections
from typing import Any

from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

#: aten ops that make the host wait for the device (their base names).
SYNC_OPS = frozenset({"_local_scalar_dense", "nonzero", "_unique2", "unique_dim", "unique_consecutive",
                      "masked_select", "_linalg_eigh", "linalg_eig", "_linalg_svd", "linalg_solve", "linalg_inv",
                      "linalg_cholesky", "_linalg_check_errors", "linalg_lstsq"})
#: Tensor methods that read a tensor's values on the host.
HOST_READS = frozenset({"item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__"})


class _HostReads(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in HOST_READS:
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))


class OpCount(TorchDispatchMode):
    """``with OpCount() as count: ...``; then ``count.ops`` (all aten ops), ``count.launches`` (those that are not
    views), ``count.syncs`` (sync-capable ops by name) and ``count.reads`` (host-read methods by name)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_name: collections.Counter[str] = collections.Counter()
        self.views = 0
        self.syncs: collections.Counter[str] = collections.Counter()
        self._reads = _HostReads()

    @property
    def reads(self) -> collections.Counter[str]:
        return self._reads.counts

    @property
    def ops(self) -> int:
        return sum(self.by_name.values())

    @property
    def launches(self) -> int:
        return self.ops - self.views

    @property
    def scalar_reads(self) -> int:
        """Sync-capable ops plus host reads that do not dispatch on the CPU (``tolist``, ``numpy``)."""
        return sum(self.syncs.values()) + self.reads["tolist"] + self.reads["numpy"]

    def __enter__(self) -> OpCount:
        self._reads.__enter__()
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        self._reads.__exit__(*exc)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        name = func.__name__.split(".")[0]
        self.by_name[name] += 1
        if func.is_view:
            self.views += 1
        if name in SYNC_OPS:
            self.syncs[name] += 1
        return func(*args, **(kwargs or {}))
