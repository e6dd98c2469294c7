"""Each run its own folder under ``log_dir``, as Lightning's ``version_N`` and the Hugging Face Trainer's dated
run folders: two runs one after the other on one ``log_dir`` never mix their records.

By default a Watch creates ``log_dir/<YYYYMMDD-HHMMSS>-<run name>`` (local time of its construction; names sort by
start), and its state ([`Watch.state_dict`][isiwatch.Watch.state_dict]) records that name, so a resumed run writes
on in its own folder. The ``run_folder`` option names the folder instead (created if missing, continued if it
exists; ``.`` is ``log_dir`` itself). The lock of `isiwatch.watch.log_folder` is a run folder's: runs write
``log_dir`` side by side, and a Watch is refused only a run folder another Watch writes.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path, PurePath
from typing import TYPE_CHECKING

from .._utils.files import shown_path

if TYPE_CHECKING:
    from .config import WatchOptions

#: The files a Watch writes in its run folder (the lock file aside, which its close removes).
RECORDS = ("metrics.jsonl", "alerts.jsonl")
#: TensorBoard's event files.
EVENTS = "events.out.tfevents.*"
#: Characters a run name keeps in its folder's name; others become ``_``.
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
#: Folders tried after a taken name (two runs of one name started in one second): ``-2``, ``-3``, ...
NAME_TRIES = 100


def folder_problem(value: object) -> str | None:
    """What keeps ``value`` from naming a folder under ``log_dir`` (a relative path that stays inside it), or
    None."""
    if not isinstance(value, str):
        return None
    path = PurePath(value)
    if not value or not value.isprintable() or path.is_absolute() or ".." in path.parts:
        return f"must be a folder name under log_dir (such as 'baseline', or '.' for log_dir itself), got {value!r}"
    return None


def folder_name(run: str, started: float) -> str:
    """``<YYYYMMDD-HHMMSS>-<run>`` for a run started at ``started`` (seconds since the epoch, local time)."""
    safe = _UNSAFE.sub("_", run).strip("._") or "run"
    return f"{time.strftime('%Y%m%d-%H%M%S', time.localtime(started))}-{safe[:80]}"


def new_run_dir(log_dir: Path, run: str) -> Path:
    """Create and return a new run folder for ``run`` under ``log_dir`` (`folder_name`; ``-2``, ``-3``, ... after
    a name that exists). A ``log_dir`` that cannot be written now (a full or read-only disk) leaves the folder to be
    created at the run's first write."""
    base = folder_name(run, time.time())
    for n in range(1, NAME_TRIES + 1):
        path = log_dir / (base if n == 1 else f"{base}-{n}")
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            continue
        except OSError:
            return path
        return path
    raise FileExistsError(f"log_dir {log_dir}: {NAME_TRIES} run folders named {base}* exist")


def run_dir_of(opts: WatchOptions, run: str) -> Path:
    """The folder a new Watch with ``log_dir`` writes: the one ``run_folder`` names, else a new one
    (`new_run_dir`)."""
    assert opts.log_dir is not None
    if opts.run_folder is not None:
        return Path(opts.log_dir, opts.run_folder)
    return new_run_dir(Path(opts.log_dir), run)


def resumed_dir(log_dir: str | None, run_folder: str | None, current: Path | None, saved: str | None) -> Path | None:
    """The folder a resumed Watch writes from now on: its saved run's (``saved``, relative to ``log_dir``), unless
    the ``run_folder`` option names one or the saved Watch wrote none; None when that is ``current`` already."""
    if log_dir is None or current is None or run_folder is not None or saved is None:
        return None
    target = Path(log_dir) / saved
    return None if os.path.normpath(target) == os.path.normpath(current) else target


def discard_unused(folder: Path) -> None:
    """Remove ``folder``, a run folder this Watch created, when it holds no record (its JSONL files are empty): a
    Watch that resumes another run leaves no empty folder behind. Anything else in it keeps it."""
    if any((folder / name).is_file() and (folder / name).stat().st_size for name in RECORDS):
        return
    with contextlib.suppress(OSError):
        for path in [*(folder / name for name in RECORDS), *folder.glob(EVENTS)]:
            path.unlink(missing_ok=True)
        folder.rmdir()


def runs_in(log_dir: Path) -> list[Path]:
    """The run folders under ``log_dir`` (its folders holding a ``metrics.jsonl``), the last written last."""
    folders = [p.parent for p in log_dir.glob(f"*/{RECORDS[0]}") if p.is_file()]
    return sorted(folders, key=lambda p: ((p / RECORDS[0]).stat().st_mtime, p.name))


#: Run folders a `latest_run_line` names, the latest ones; an earlier one is left to ``ls``.
NAMED_RUNS = 4


def latest_run_line(log_dir: Path, runs: list[Path]) -> str:
    """The one line ``isiwatch report LOG_DIR`` prints before it reports the latest of ``runs`` (`runs_in`)."""
    names = [p.name for p in runs[-NAMED_RUNS:]]
    shown = ", ".join((["..."] if len(runs) > NAMED_RUNS else []) + names)
    if len(runs) == 1:
        return f"{shown_path(log_dir)} holds 1 run: reporting {shown_path(runs[-1])}"
    return (f"{shown_path(log_dir)} holds {len(runs)} runs ({shown}): reporting the latest, {shown_path(runs[-1])} "
            "(pass a run's folder for another)")
