"""Atomic output: write to a temporary file beside the target, then rename over it."""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_write(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; it replaces ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def finite_or_none(value: float | None) -> float | None:
    """JSON has no NaN/Inf: non-finite numbers are written as null."""
    return value if value is None or math.isfinite(value) else None


def write_json(path: str | Path, data) -> Path:
    with atomic_write(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
    return Path(path)
