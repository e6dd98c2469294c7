"""The options of ``truncate``, declared once: `TruncateOptions`' fields are the keyword options' names, types and
defaults that `TruncateRequest` carries, that [`truncate`][isiwatch.truncate]'s signature repeats (its test holds
them equal) and that the ``isiwatch truncate`` command takes its defaults from (`OPTION_DEFAULTS`).

This module imports neither torch nor timm: the command line reads it when it starts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from .._utils.option_error import OptionError
from .strategies import DEFAULT_BRIDGE, DEFAULT_BUDGET, DEFAULT_CONFIDENCE, DEFAULT_MAX_DROP, HEAL_EPOCHS

if TYPE_CHECKING:
    from .data_split import Data

__all__ = ["OPTION_DEFAULTS", "REPORT_FORMATS", "TruncateOptions", "report_format"]

#: What ``report`` writes, by the extension of its name: the report as JSON, or as a self-contained HTML page.
REPORT_FORMATS = {".json": "JSON", ".html": "HTML"}


def report_format(path: Path) -> str:
    """The format ``report`` writes to ``path`` (a key of `REPORT_FORMATS`, by its extension in any case); any other
    extension is refused in one line (an `OptionError`), before any file is read."""
    suffix = path.suffix.lower()
    if suffix not in REPORT_FORMATS:
        named = f"the extension {suffix}" if suffix else "no extension"
        raise OptionError("{report} {path}: {named} names no report format; give a path ending in "
                          + " or ".join(f"{k} ({v})" for k, v in REPORT_FORMATS.items()), path=path, named=named)
    return suffix


@dataclass(kw_only=True)
class TruncateOptions:
    """Every keyword option of [`truncate`][isiwatch.truncate] with its default (what each does: its ``Args``).
    ``batch_size`` and ``workers`` default to timm ``train.py``'s 128 and 4 (``isiwatch.io.timm_data``'s
    ``DEFAULT_BATCH_SIZE`` and ``DEFAULT_WORKERS``, which a test holds equal: that module loads torch)."""

    analysis: Path | None = None
    data: Data = "mnist"
    eval_data: Data | None = None
    strategy: str | None = None
    keep: int | None = None
    max_drop: float = DEFAULT_MAX_DROP
    confidence: float = DEFAULT_CONFIDENCE
    budget: int = DEFAULT_BUDGET
    train_last: int | None = None
    epochs: int = HEAL_EPOCHS
    heal_steps: int | None = None
    bridge: str = DEFAULT_BRIDGE
    journal: Path | None = None
    resume: bool = False
    lr: float | None = None
    distill: bool = False
    metric: str | None = None
    images: int = 1000
    fmt: str = "pt"
    report: Path | None = None  # its extension says the format: REPORT_FORMATS
    arch: str | None = None
    num_heads: int | None = None
    prefer_ema: bool = True
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    device: str = "cpu"
    seed: int = 0
    progress: bool = False
    batch_size: int = 128
    workers: int = 4
    devices: int = 1
    num_nodes: int = 1
    dist_strategy: str = "auto"
    precision: str | None = None
    echo: Callable[[str], None] | None = None
    class_map: Path | dict[str, int] | None = None


#: Each option's default by name, for the command line's options of the same names.
OPTION_DEFAULTS: dict[str, object] = {f.name: f.default for f in fields(TruncateOptions) if f.default is not MISSING}
