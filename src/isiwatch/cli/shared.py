"""What several commands share: option types and options (``--arch``, ``--mean``, ``--std``, ``--progress``,
``--workers``), the bounds of the healing options, the path checks made before any work and the lines that name
what was read and written. It imports neither torch nor timm (the command line's start-up reads it)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    _StatsType = click.ParamType[tuple[float, ...]]
else:  # click's annotations make ParamType generic; older clicks cannot subscript it at run time
    _StatsType = click.ParamType


def resolve_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise click.BadParameter("CUDA requested but no CUDA device is available", param_hint="--device")
    return name


class _Stats(_StatsType):
    """One number or one per channel, separated by commas or spaces: ``--mean 0.5`` or
    ``--mean 0.485,0.456,0.406`` (click options take a fixed number of values)."""

    name = "M[,M,M]"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> tuple[float, ...]:
        if isinstance(value, tuple):
            return value
        parts = value if isinstance(value, (list, tuple)) else str(value).replace(",", " ").split()
        try:
            stats = tuple(float(v) for v in parts)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number or a comma-separated list of numbers", param, ctx)
        if not 1 <= len(stats) <= 4:
            self.fail(f"{value!r}: give one value or one per channel", param, ctx)
        if not all(math.isfinite(v) for v in stats):
            self.fail(f"{value!r}: every value must be a finite number", param, ctx)
        if param is not None and param.name == "std" and not all(v > 0 for v in stats):
            self.fail(f"{value!r}: standard deviations must be positive", param, ctx)
        return stats


MEAN = click.option("--mean", type=_Stats(), help="Per-channel mean to normalise images with, e.g. 0.5 or "
                                                  "0.485,0.456,0.406 (default: the checkpoint's training args, "
                                                  "else the model's pretrained_cfg; MNIST's for --data mnist).")
ARCH = click.option("--arch", metavar="NAME",
                    help="timm architecture name (default: recorded in the checkpoint or inferred).")
STD = click.option("--std", type=_Stats(), help="Per-channel standard deviation, with --mean.")


def inputs_line(weights: str, norm: Mapping[str, Any]) -> str:
    """Which weights and which normalisation an analysis or cut used (both change every number after it)."""
    def numbers(values: Iterable[float]) -> str:
        return ",".join(f"{v:g}" for v in values)

    return (f"weights: {'EMA (state_dict_ema)' if weights == 'ema' else 'state_dict'}; normalised with mean "
            f"{numbers(norm['mean'])} std {numbers(norm['std'])} ({norm['source']})")


class FiniteRange(click.FloatRange):
    """click's FloatRange, refusing also nan (which passes its bounds: every comparison with it is false) and
    infinities when the range is open-ended."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{number} is not a finite number", param, ctx)
        return number


#: Upper bounds of the healing options, so that a slip (--heal-steps 1000000000000) is refused when the command
#: line is read instead of running for ever: a heal is a short fine-tune, and 10,000,000 optimizer steps of 128
#: images are more than three 300-epoch trainings on ImageNet-1k's 1,281,167 images (3.0 M steps each).
MAX_HEAL_STEPS = 10_000_000
MAX_HEAL_EPOCHS = 10_000
#: --seed: the range Lightning's seed_everything (and numpy) accept, 0 to 2**32 - 1.
MAX_SEED = 2**32 - 1


def check_paths(inputs: Mapping[str, Path | str | None] | None = None,
                 files: Mapping[str, Path | None] | None = None, folders: Mapping[str, Path | None] | None = None
                 ) -> frozenset[Path]:
    """Every path a command reads or writes, checked before any work (``isiwatch._utils.files.check_output``):
    ``inputs`` must be a regular file or a directory, ``files`` are file outputs and ``folders`` folder outputs,
    each in a place that can be written; keys name them in the message ("" for an argument, "--out" for an option).
    ``None`` is an option not given. Returns the files already there that an output may replace (resolved): the
    file outputs and what the output folders hold, for ``wrote``."""
    from .._utils.files import check_input, check_output

    for name, path in (inputs or {}).items():
        if path is not None:
            check_input(path, name, "checkpoint" if not name else "file or directory")
    existing: set[Path] = set()
    for name, path in (files or {}).items():
        if path is not None and check_output(path, name).exists():
            existing.add(path.resolve())
    for name, path in (folders or {}).items():
        if path is not None and check_output(path, name, folder=True).exists():
            existing.update(p.resolve() for p in path.iterdir())
    return frozenset(existing)


def wrote(path: Path, existing: frozenset[Path]) -> str:
    """The line naming an output written, saying when it replaced a file that was there before the command ran
    (atomically: the old file stayed whole until the new one was complete)."""
    return f"wrote {path}" + (" (replaced the existing file)" if Path(path).resolve() in existing else "")


PROGRESS = click.option("--progress/--no-progress", default=None,
                        help="Draw progress bars [default: only when stderr is a terminal].")


def progress_shown(force: bool | None) -> bool:
    from .._utils.progress import show_progress

    return show_progress(force)


#: timm train.py's default --workers.
WORKERS = click.option("--workers", type=click.IntRange(min=0), default=4, show_default=True,
                       help="DataLoader worker processes reading images (0: in the main process).")
