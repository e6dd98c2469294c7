"""Watch options and their YAML form.

``isiwatch.yaml`` maps one-to-one onto [`WatchOptions`][isiwatch.WatchOptions] at the top level; optional sections named
after CLI commands (``analyze:``, ``demo:``, ``truncate:``, ``specialize:``) hold that command's options.
Unknown keys, values of the wrong type or out of range, duplicate keys, aliases and non-standard tags are errors
that name the key and its line.
"""

from __future__ import annotations

import ipaddress
import math
import re
import reprlib
import types
import typing
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from .._utils.files import MAX_CONFIG_BYTES, PathError, check_size
from .._utils.option_error import MAX_COUNT
from ..measure.analysis import METRICS
from .freezing import FreezePolicy, PolicyError
from .friction import FRICTION_THRESHOLD
from .run_folder import folder_problem


class ConfigError(ValueError):
    """An invalid option; the message names the key (and the file and line for YAML)."""


@dataclass
class WatchOptions:
    """Every serialisable option of [`isiwatch.Watch`][isiwatch.Watch] (see its docstring for meanings)."""

    every_n_steps: int = 100
    """Training steps between two samples (probe passes)."""
    log_dir: str | None = None
    """Folder of the runs' folders: each run writes TensorBoard, `metrics.jsonl` and `alerts.jsonl` in its own,
    `<YYYYMMDD-HHMMSS>-<run name>` (a resumed run continues its own); none: no files."""
    run_folder: str | None = None
    """The run's folder under `log_dir` instead of a new one: a name (created if missing, continued if it exists) or
    `.` for `log_dir` itself."""
    run_name: str | None = None
    """The run's name in every export; none: a random one (a resumed run keeps its saved name)."""
    prometheus_port: int | None = None
    """Serve Prometheus gauges over HTTP on this port; none: no server."""
    prometheus_host: str = "127.0.0.1"
    """Address the Prometheus server listens on."""
    pushgateway: str | None = None
    """Push each sample to this Prometheus push gateway (`host:port` or an http/https URL)."""
    textfile: str | None = None
    """Write each sample to this file for node_exporter's textfile collector."""
    phase_metric: str = "token_similarity"
    """The per-layer curve whose plateau the phase detector looks for."""
    min_layers: int = 3
    """Blocks a flat stretch must span to count as a plateau."""
    plateau_patience: int = 3
    """Samples a stable plateau must last before `plateau_onset` (also `stop_on_plateau`'s patience)."""
    probe_batch_size: int = 256
    """Probe images per forward pass of a sample."""
    probe_dtype: str | None = None
    """`bfloat16` or `float16`: run the probe forward under `torch.autocast` in that dtype (cheaper where the model
    trains in it; statistics are still accumulated in float32). None: the model's own dtype, autocast off."""
    with_isi_recon: bool = False
    """Also track the reconstruction-based ISI (slower)."""
    history_size: int = 1000
    """Samples kept in `watch.history`."""
    heatmap_every: int = 10
    """Render TensorBoard's depth x step heat-maps every this many samples."""
    isi_stall_window: int = 5
    """Samples over which `isi_stall` compares the mean ISI and the loss."""
    isi_stall_min_rise: float = 0.01
    """`isi_stall` opens when the mean ISI rose by less than this (relative) over the window..."""
    isi_stall_min_loss_drop: float = 0.01
    """...while the loss fell by more than this (relative)."""
    norm_friction_threshold: float | None = FRICTION_THRESHOLD
    """`norm_friction_high` opens above this friction; none: the alert is off."""
    probe_confidence: float = 0.95
    """Confidence at which one probe counts as better than another, by the exact paired test on their held-out
    predictions: `cls_marginalized` opens, and the published `recommended_depth` adds blocks, only beyond the
    probes' own noise."""
    monitor: str | None = None
    """Series early stopping watches (`probe_cls/last`, `isi/layer_03`, `loss`); none: no early stopping."""
    mode: str = "min"
    """`min` or `max`: the direction in which `monitor` improves (Lightning's `mode`)."""
    min_delta: float = 0.0
    """Smallest change that counts as an improvement, signed as in Lightning."""
    patience: int = 3
    """Samples without improvement before early stopping stops the run."""
    warmup: int = 0
    """Samples ignored by early stopping at the start."""
    check_finite: bool = True
    """Stop when `monitor` is NaN or infinite."""
    stopping_threshold: float | None = None
    """Stop as soon as `monitor` reaches this value."""
    divergence_threshold: float | None = None
    """Stop as soon as `monitor` is worse than this value."""
    stop_on_plateau: bool = False
    """Stop once the plateau span and the last-layer probe accuracy have been stable for `plateau_patience`
    samples."""
    max_consecutive_failures: int = 5
    """Failed samples in a row after which the Watch disables itself (training goes on)."""
    strict: bool = False
    """Re-raise failures inside the Watch instead of reporting them (tests, debugging)."""
    probe_every: int = 1
    """Fit the linear probes on every k-th sample only."""
    overhead_budget: float | None = None
    """Fraction of training time the Watch may take (e.g. 0.005): it stretches its sampling interval to stay
    under it. None: off."""
    freeze_settled: bool | FreezePolicy = False
    """Freeze the blocks whose output has settled: `True` (defaults) or a `FreezePolicy`. Experimental."""

    def __post_init__(self) -> None:
        """Direct construction gets the same type and range checks as YAML and ``Watch(**options)``."""
        for f in fields(self):
            setattr(self, f.name, _check(f.name, getattr(self, f.name)))


#: Top-level YAML keys that hold a CLI command's options instead of a Watch option.
COMMAND_SECTIONS = ("analyze", "demo", "truncate", "specialize")

_HINTS = typing.get_type_hints(WatchOptions)
_NAMES = {f.name for f in fields(WatchOptions)}


#: At most this many characters of a user's value are quoted in an error message.
QUOTE_LIMIT = 200

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, QUOTE_LIMIT, QUOTE_LIMIT


def clip(text: str) -> str:
    """``text`` cut to `QUOTE_LIMIT` characters: a huge value must not turn one error line into megabytes."""
    return text if len(text) <= QUOTE_LIMIT else text[:QUOTE_LIMIT] + "..."


def quote(value: object) -> str:
    """``repr`` of user content, bounded (reprlib never builds the full text of a huge nested value)."""
    return clip(_REPR.repr(value))


def _at_least(low: int) -> Callable[[object], str | None]:
    """A count of at least ``low`` and at most `MAX_COUNT`."""
    def rule(v: object) -> str | None:
        if not isinstance(v, int):
            return None
        if v < low:
            return f"must be at least {low}, got {v}"
        return None if v <= MAX_COUNT else f"must be at most {MAX_COUNT:,}, got {clip(str(v))}"
    return rule


def _one_of(choices: tuple[str | None, ...]) -> Callable[[object], str | None]:
    shown = ", ".join("null" if c is None else c for c in choices)
    return lambda v: None if v in choices else f"must be one of {shown}; got {quote(v)}"


def _finite(v: object) -> str | None:
    return None if not isinstance(v, float) or math.isfinite(v) else f"must be a finite number, got {v}"


def _fraction(v: object) -> str | None:
    return None if not isinstance(v, float) or 0 < v < 1 else f"must be a fraction between 0 and 1, got {v}"


def _port(v: object) -> str | None:
    return None if not isinstance(v, int) or 0 <= v <= 65535 else f"must be a port 0-65535, got {v}"


#: A host name: dot-separated labels of letters, digits, ``-`` (not first or last) and ``_`` (Docker's names).
_HOST_NAME = re.compile(r"(?!-)[A-Za-z0-9_-]+(?<!-)(\.(?!-)[A-Za-z0-9_-]+(?<!-))*")


def _host(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return _HOST_NAME.fullmatch(name) is not None
    return True


def gateway_problem(v: object) -> str | None:
    """What keeps ``v`` from being a push gateway address prometheus_client can push to (``host:port``, or an
    http(s) URL with a host name or address, printable and without spaces), or None."""
    if not isinstance(v, str):
        return None
    if not v.isprintable() or any(c.isspace() for c in v):
        return f"must be a URL such as http://127.0.0.1:9091, without spaces or control characters; got {quote(v)}"
    url = v if "://" in v else f"http://{v}"
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"must be a URL such as http://127.0.0.1:9091, got {quote(v)} ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname or not _host(parts.hostname):
        return f"must be an http(s) URL with a host, such as http://127.0.0.1:9091, got {quote(v)}"
    return None if port is None or port > 0 else f"must name a port 1-65535, got {quote(v)}"


#: Range and choice rules, shared by the Watch (through `build_options`) and ``isiwatch config check``.
_RULES: dict[str, Callable[[object], str | None]] = {
    "every_n_steps": _at_least(1), "prometheus_port": _port, "pushgateway": gateway_problem,
    "max_consecutive_failures": _at_least(1), "phase_metric": _one_of(METRICS),
    "min_layers": _at_least(2), "plateau_patience": _at_least(1), "probe_batch_size": _at_least(1),
    "history_size": _at_least(1), "heatmap_every": _at_least(1), "isi_stall_window": _at_least(2),
    "isi_stall_min_rise": _finite, "isi_stall_min_loss_drop": _finite, "norm_friction_threshold": _finite,
    "probe_confidence": _fraction,
    "mode": _one_of(("min", "max")), "min_delta": _finite, "patience": _at_least(0), "warmup": _at_least(0),
    "stopping_threshold": _finite, "divergence_threshold": _finite, "probe_every": _at_least(1),
    "overhead_budget": _fraction, "probe_dtype": _one_of((None, "bfloat16", "float16")),
    "run_folder": folder_problem,
}


def _allowed(hint: type | types.UnionType) -> tuple[type, ...]:
    return typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)


def _check(key: str, value: object, where: str = "", nested: Mapping[str, str] | None = None) -> object:
    """The value of Watch option ``key``, after its type and range checks; ``where`` prefixes errors, and
    ``nested`` (a sub-key's own prefix, for a mapping value read from YAML) those about one of the value's keys."""
    if key not in _NAMES:
        raise ConfigError(f"{where}unknown option {quote(key)}")
    if key == "freeze_settled" and isinstance(value, dict):  # the YAML form of a FreezePolicy
        try:
            value = FreezePolicy.from_mapping(value)
        except PolicyError as exc:
            at = (nested or {}).get(exc.key, where)
            raise ConfigError(f"{at}option 'freeze_settled' {clip(str(exc))}") from None
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}option 'freeze_settled' {clip(str(exc))}") from None
    allowed = _allowed(_HINTS[key])
    if isinstance(value, bool) and bool not in allowed:
        ok = False
    elif isinstance(value, int) and float in allowed and not isinstance(value, bool):
        value, ok = float(value), True
    else:
        ok = isinstance(value, allowed)
    if not ok:
        names = " or ".join("null" if a is type(None) else a.__name__ for a in allowed)
        raise ConfigError(f"{where}option {key!r} must be {names}, got {type(value).__name__} {quote(value)}")
    problem = _RULES[key](value) if key in _RULES else None
    if problem:
        raise ConfigError(f"{where}option {key!r} {problem}")
    return value


def build_options(config: str | Path | dict[str, object] | None = None, **overrides: object) -> WatchOptions:
    """Options from a YAML file or dict, with keyword ``overrides`` (explicit arguments) on top."""
    values: dict[str, Any] = {}  # each value of its WatchOptions field's type, as _check checked
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
    watch: dict[str, object]
    sections: dict[str, dict[str, tuple[object, int]]]


class _Refused(yaml.MarkedYAMLError):  # type: ignore[misc]  # PyYAML ships no type hints
    """Valid YAML that a config file may not use."""


class _Loader(yaml.SafeLoader):  # type: ignore[misc]  # same
    """SafeLoader that refuses aliases and duplicate keys.

    A few hundred bytes of nested aliases expand to gigabytes once printed or converted, and a config file
    has no need for them; a duplicate key would silently take the last value.
    """

    def compose_node(self, parent: yaml.Node | None, index: yaml.Node | int | None) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _Refused(problem=f"YAML aliases (*{event.anchor[:40]}) are not supported; write the value out",
                           problem_mark=event.start_mark)
        return super().compose_node(parent, index)

    def compose_mapping_node(self, anchor: str | None) -> yaml.MappingNode:
        node = super().compose_mapping_node(anchor)
        first: dict[tuple[str, str], int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            key = (key_node.tag, key_node.value)
            if key in first:
                raise _Refused(problem=f"duplicate key {quote(key_node.value)} (first given on line {first[key]})",
                               problem_mark=key_node.start_mark)
            first[key] = key_node.start_mark.line + 1
        return node


def _yaml_error(path: Path, exc: yaml.YAMLError) -> ConfigError:
    mark = getattr(exc, "problem_mark", None)
    line = f":{mark.line + 1}" if mark else ""
    problem = clip(str(getattr(exc, "problem", None) or exc))
    return ConfigError(f"{path}{line}: {problem}" if isinstance(exc, _Refused) else
                       f"{path}{line}: invalid YAML ({problem})")


def _compose(text: str, path: Path) -> tuple[_Loader, yaml.Node | None]:
    """The document's node tree; every YAML problem becomes a one-line `ConfigError`."""
    loader = _Loader(text)
    try:
        return loader, loader.get_single_node()
    except yaml.YAMLError as exc:
        raise _yaml_error(path, exc) from None
    except RecursionError:
        raise ConfigError(f"{path}: invalid YAML (nested too deeply)") from None


def _construct(loader: _Loader, node: yaml.Node, path: Path) -> object:
    """One value; a tag the safe loader refuses (``!!python/object``, ``!!int abc``) is a config error."""
    try:
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise _yaml_error(path, exc) from None
    except Exception as exc:  # standard tags on bad text (!!int abc, !!timestamp x) raise ValueError and friends
        raise ConfigError(f"{path}:{node.start_mark.line + 1}: invalid YAML value ({clip(str(exc))})") from None


def _mapping(node: yaml.Node, path: Path, what: str) -> list[tuple[yaml.ScalarNode, yaml.Node]]:
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{path}:{node.start_mark.line + 1}: {what} must be a mapping of option: value")
    pairs: list[tuple[yaml.ScalarNode, yaml.Node]] = node.value
    for key_node, _ in pairs:
        if not isinstance(key_node, yaml.ScalarNode):
            raise ConfigError(f"{path}:{key_node.start_mark.line + 1}: {what} has a key that is not a name")
    return pairs


def _section(loader: _Loader, node: yaml.Node, path: Path, name: str) -> dict[str, tuple[object, int]]:
    """``{option: (value, line)}`` of one command section; ``batch-size`` and ``batch_size`` are one key."""
    result: dict[str, tuple[object, int]] = {}
    for key_node, value_node in _mapping(node, path, f"section {name!r}"):
        key, line = key_node.value.replace("-", "_"), key_node.start_mark.line + 1
        if key in result:
            raise ConfigError(f"{path}:{line}: duplicate key {quote(key)} in section {name!r} "
                              f"(first given on line {result[key][1]})")
        result[key] = (_construct(loader, value_node, path), line)
    return result


def load_yaml(path: str | Path) -> ConfigFile:
    """Read and validate ``isiwatch.yaml``; errors read ``FILE:LINE: problem``."""
    path = Path(path)
    try:
        check_size(path, MAX_CONFIG_BYTES, "an isiwatch.yaml")  # before YAML builds whatever the file holds
        text = path.read_text(encoding="utf-8")
    except PathError as exc:
        raise ConfigError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read config ({getattr(exc, 'strerror', None) or exc})") from None
    loader, root = _compose(text, path)
    result = ConfigFile(path, {}, {})
    if root is None:
        return result
    for key_node, value_node in _mapping(root, path, "the config"):
        key = key_node.value
        if key in COMMAND_SECTIONS:
            result.sections[key] = _section(loader, value_node, path, key)
        else:
            where = f"{path}:{key_node.start_mark.line + 1}: "
            nested = {k.value: f"{path}:{k.start_mark.line + 1}: " for k, _ in value_node.value
                      if isinstance(k, yaml.ScalarNode)} if isinstance(value_node, yaml.MappingNode) else None
            result.watch[key] = _check(key, _construct(loader, value_node, path), where, nested)
    return result
