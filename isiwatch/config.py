"""Watch options and their YAML form.

``isiwatch.yaml`` maps one-to-one onto :class:`WatchOptions` at the top level; optional sections named
after CLI commands (``analyze:``, ``demo:``, ``truncate:``, ``specialize:``) hold that command's options.
Unknown keys and values of the wrong type are errors that name the key and its line.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from .friction import FRICTION_THRESHOLD


class ConfigError(ValueError):
    """An invalid option; the message names the key (and the file and line for YAML)."""


@dataclass
class WatchOptions:
    """Every serialisable option of :class:`isiwatch.Watch` (see its docstring for meanings)."""

    every_n_steps: int = 100
    log_dir: str | None = None
    run_name: str | None = None
    prometheus_port: int | None = None
    prometheus_host: str = "127.0.0.1"
    pushgateway: str | None = None
    textfile: str | None = None
    phase_metric: str = "token_similarity"
    min_layers: int = 3
    plateau_patience: int = 3
    probe_batch_size: int = 256
    with_isi_recon: bool = False
    history_size: int = 1000
    heatmap_every: int = 10
    isi_stall_window: int = 5
    isi_stall_min_rise: float = 0.01
    isi_stall_min_loss_drop: float = 0.01
    norm_friction_threshold: float | None = FRICTION_THRESHOLD
    monitor: str | None = None
    mode: str = "min"
    min_delta: float = 0.0
    patience: int = 3
    warmup: int = 0
    check_finite: bool = True
    stopping_threshold: float | None = None
    divergence_threshold: float | None = None
    stop_on_plateau: bool = False


#: Top-level YAML keys that hold a CLI command's options instead of a Watch option.
COMMAND_SECTIONS = ("analyze", "demo", "truncate", "specialize")

_HINTS = typing.get_type_hints(WatchOptions)
_NAMES = {f.name for f in fields(WatchOptions)}


def _allowed(hint) -> tuple[type, ...]:
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    return tuple(type(None) if a is type(None) else a for a in args)


def _check(key: str, value, where: str = "") -> object:
    if key not in _NAMES:
        raise ConfigError(f"{where}unknown option {key!r}")
    allowed = _allowed(_HINTS[key])
    if isinstance(value, bool) and bool not in allowed:
        ok = False
    elif isinstance(value, int) and float in allowed and not isinstance(value, bool):
        value, ok = float(value), True
    else:
        ok = isinstance(value, allowed)
    if not ok:
        names = " or ".join("null" if a is type(None) else a.__name__ for a in allowed)
        raise ConfigError(f"{where}option {key!r} must be {names}, got {type(value).__name__} {value!r}")
    return value


def build_options(config: str | Path | dict | None = None, **overrides) -> WatchOptions:
    """Options from a YAML file or dict, with keyword ``overrides`` (explicit arguments) on top."""
    values = {}
    if isinstance(config, dict):
        values = {k: _check(k, v) for k, v in config.items()}
    elif config is not None:
        values = load_yaml(config).watch
    values.update({k: _check(k, v) for k, v in overrides.items()})
    return WatchOptions(**values)


@dataclass
class ConfigFile:
    """A parsed ``isiwatch.yaml``: Watch options and per-command sections of ``{key: (value, line)}``."""

    path: Path
    watch: dict
    sections: dict[str, dict[str, tuple[object, int]]]


def _mapping(node, path: Path, what: str) -> list:
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{path}:{node.start_mark.line + 1}: {what} must be a mapping of option: value")
    return node.value


def load_yaml(path: str | Path) -> ConfigFile:
    """Read and validate ``isiwatch.yaml``; errors read ``FILE:LINE: problem``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{line}: invalid YAML ({getattr(exc, 'problem', None) or exc})") from None
    result = ConfigFile(path, {}, {})
    if root is None:
        return result
    seen: set[str] = set()
    for key_node, value_node in _mapping(root, path, "the config"):
        where = f"{path}:{key_node.start_mark.line + 1}: "
        key = key_node.value
        if key in seen:
            raise ConfigError(f"{where}option {key!r} given twice")
        seen.add(key)
        if key in COMMAND_SECTIONS:
            result.sections[key] = {
                k.value.replace("-", "_"): (yaml.safe_load(yaml.serialize(v)), k.start_mark.line + 1)
                for k, v in _mapping(value_node, path, f"section {key!r}")}
        else:
            result.watch[key] = _check(key, yaml.safe_load(yaml.serialize(value_node)), where)
    return result
