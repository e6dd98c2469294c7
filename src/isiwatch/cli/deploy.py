"""``isiwatch deploy DIR``: the Prometheus configuration and alert rules, the Grafana provisioning and dashboard,
and the docker-compose file that runs them ship inside the package (a wheel has no repository folder to point
at); this writes them where the user asks."""

from __future__ import annotations

import os
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

from .._utils.files import PathError, atomic_files, shown_path

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

#: The packaged deployment (``src/isiwatch/deploy`` in the repository).
DEPLOYMENT = files("isiwatch") / "deploy"


def _walk(folder: Traversable, prefix: str = "") -> Iterator[tuple[str, Traversable]]:
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        name = f"{prefix}{entry.name}"
        if entry.is_dir():
            yield from _walk(entry, f"{name}/")
        elif entry.is_file():
            yield name, entry


def deployment_files() -> dict[str, bytes]:
    """Every packaged deployment file by its path relative to the deployment folder (``prometheus/rules/...``)."""
    return {name: entry.read_bytes() for name, entry in _walk(DEPLOYMENT)}


def _check_empty(dest: Path) -> None:
    """Refuse, before writing anything, a ``dest`` that holds files already: the deployment is written whole into
    a new or empty folder, never mixed with an older copy."""
    if dest.is_dir() and any(os.scandir(dest)):
        raise PathError(f"{shown_path(dest)}: is not empty; give a new or empty folder")


def write_deployment(dest: str | Path) -> list[Path]:
    """Write the packaged deployment into ``dest`` (new or empty), all files at once; returns the files written."""
    dest = Path(dest)
    _check_empty(dest)
    contents = deployment_files()
    with atomic_files(dest) as stage:
        for name, data in contents.items():
            target = stage / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    return [dest / name for name in contents]
