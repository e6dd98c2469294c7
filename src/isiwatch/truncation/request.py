"""The first stage of ``truncate``: `TruncateRequest`, everything it was asked to do, checked on construction before
any file is read (an impossible option or combination is refused in one line that names the parameters)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from .._utils.files import file_identity
from .._utils.option_error import OptionError
from .data_split import NAMED
from .engine import FabricOptions
from .options import TruncateOptions, report_format
from .strategies import DEFAULT_STRATEGY, check_search_options, get_strategy

__all__ = ["TruncateRequest"]


@dataclass
class TruncateRequest(TruncateOptions):
    """Everything ``truncate`` was asked to do, checked on construction before any file is read.

    Fields are [`truncate`][isiwatch.truncate]'s parameters (``checkpoint``: its ``checkpoint_or_model``; the
    keyword options are `TruncateOptions`'); paths given as strings become `Path`. ``strategy`` None becomes
    ``auto`` without ``keep`` and `DEFAULT_STRATEGY` with it; an impossible combination raises ``ValueError`` (an
    `OptionError` naming the parameters) in one line.
    """

    checkpoint: Path | nn.Module
    out: Path | None = None

    @property
    def fabric_options(self) -> FabricOptions:
        """Where healing and evaluation run: ``device``'s accelerator, ``devices``, ``num_nodes``,
        ``dist_strategy`` and ``precision``."""
        return FabricOptions(self.device.split(":")[0], self.devices, self.num_nodes, self.dist_strategy,
                             self.precision)

    def __post_init__(self) -> None:
        if not isinstance(self.checkpoint, nn.Module):
            self.checkpoint = Path(self.checkpoint)
        self.out, self.analysis, self.report, self.journal = (
            None if p is None else Path(p) for p in (self.out, self.analysis, self.report, self.journal))
        self.strategy = self.strategy or ("auto" if self.keep is None else DEFAULT_STRATEGY)
        if self.strategy != "auto":
            get_strategy(self.strategy)
        elif self.keep is not None:
            raise OptionError("{keep} fixes the depth; it cannot be combined with {strategy:'auto'}")
        check_search_options(self.max_drop, self.budget, self.confidence, self.heal_steps, self.bridge)
        if self.report is not None:
            report_format(self.report)
        if self.resume and self.journal is None:
            raise OptionError("{resume} continues the search journalled in {journal}; give one (the command line "
                              "keeps it beside {out})")
        if self.fmt not in ("pt", "safetensors"):
            raise ValueError(f"unknown format {self.fmt!r} (use 'pt' or 'safetensors')")
        if self.epochs < 0 or self.images < 4:
            raise ValueError(f"epochs must be at least 0 and images at least 4, got {self.epochs} and {self.images}")
        if self.batch_size < 1 or self.workers < 0:
            raise OptionError("{batch_size} must be at least 1 and {workers} at least 0, got {size} and {count}",
                              size=self.batch_size, count=self.workers)
        self.fabric_options  # noqa: B018  (checks the distributed options)
        if isinstance(self.checkpoint, nn.Module) and self.out is not None:
            raise OptionError("{out} writes a checkpoint rebuilt from the input checkpoint's architecture; a model "
                              "object has none: save the result's model yourself")
        if self.mean is not None and not isinstance(self.data, NAMED):
            raise OptionError("{mean} and {std} normalise images read from a name or a folder; tensors and "
                              "DataLoaders are used as they are")
        if self.class_map is not None and not isinstance(self.class_map, dict):
            self.class_map = _read_class_map(Path(self.class_map))  # before the checkpoint or any image is read
        path = None if isinstance(self.checkpoint, nn.Module) else self.checkpoint
        _check_paths({"checkpoint": path, "analysis": self.analysis},
                     {"out": self.out, "report": self.report, "journal": self.journal})
        if path is not None and path.is_dir() and self.out is not None and self.out.exists():
            raise OptionError("{out} {path}: exists; a truncated Hugging Face model is written to a new directory",
                              path=self.out)


def _check_paths(inputs: dict[str, Path | None], outputs: dict[str, Path | None]) -> None:
    """Every output path differs from every input and from the other outputs (nothing is overwritten); the
    dictionaries map option names to paths."""
    seen = {file_identity(p): name for name, p in inputs.items() if p is not None}
    for name, path in outputs.items():
        if path is None:
            continue
        clash = seen.get(file_identity(path))
        if clash is not None:
            kind = "input" if clash in inputs else "output"
            raise OptionError(f"{{path}}: {{{name}}} names the same file as the {kind} {{{clash}}}; choose another "
                              "path", path=path)
        seen[file_identity(path)] = name


def _read_class_map(path: Path) -> dict[str, int]:
    """A class map file: a JSON object of class folder name → model output index, or a JSON list of the class
    names in output order; refused in one line."""
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise OptionError("{class_map} {path}: not a readable JSON file ({why})", path=path,
                          why=str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return {name: i for i, name in enumerate(value)}
    if isinstance(value, dict) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                       for v in value.values()):
        return {str(k): v for k, v in value.items()}
    raise OptionError("{class_map} {path}: not a JSON object of class folder name to output index (or a list of "
                      "the class names in output order)", path=path)
