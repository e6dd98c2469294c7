"""One writer per run folder: the Watch writing a run's folder (`isiwatch.watch.run_folder`, under ``log_dir``) holds
an advisory lock on a file in it.

Two Watches appending to one ``metrics.jsonl`` would interleave two runs, and a resume's rewrite would replace the
file under the other one's open handle, losing its records. So the first Watch on a folder takes an exclusive
``flock`` on ``.isiwatch.lock`` there (it records the run's name, process id and host) and a second one, in this
process or another, is refused in one line naming it. The operating system drops the lock with the process, so a
crashed run's folder is free for its resume (its lock file stays, unlocked); a Watch that closes removes the file, so
a finished run's folder holds no lock. A folder that cannot be written when the Watch is built (a full or
read-only disk) is locked at its first write instead, so two Watches built then still never share it. Every file
the Watch writes there (its JSONL records, TensorBoard's event files) is opened under the lock (`LogFolderLock.claim`),
so nothing of a Watch refused the folder reaches it. The holder's
record is rewritten in place by one write of a fixed-size, space-padded JSON object (never truncated first), so a
Watch refused the folder always reads a whole record. Locks are advisory and local: a folder shared over NFS between
hosts may not be protected (``flock`` there depends on the mount).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # Windows: no flock; the folder is not locked there
    fcntl = None  # type: ignore[assignment]

from .._utils.files import shown_path

#: The lock file's name in ``log_dir``.
LOCK_NAME = ".isiwatch.lock"
#: Attempts to lock a lock file that its holder removes as this Watch opens it (a release racing an acquire).
LOCK_TRIES = 5
#: Bytes of the holder's record: its JSON padded with spaces (valid JSON), so each rewrite covers the last one.
RECORD_BYTES = 512
#: How long a refused Watch waits for the holder's record (seconds): the holder writes it just after it locks.
RECORD_WAIT_S = 0.5
#: Held by a thread of this process from taking a folder's lock to writing its record.
_TAKING = threading.Lock()


class FolderInUse(ValueError):
    """Another Watch (this process's or another's) writes this log folder."""


def _record(fd: int) -> dict[str, Any] | None:
    """The lock file's record of its holder (run, pid, host), or None when it is unreadable."""
    try:
        record = json.loads(os.pread(fd, 4096, 0))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _described(record: dict[str, Any] | None) -> str | None:
    """``run 'demo' (pid 4242 on host)`` from a whole record of a live holder; None for no record, a partial one
    or one left by a process of this host that has ended (the holder has locked but not written yet)."""
    try:
        run, pid, host = record["run"], int(record["pid"]), str(record["host"])  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        return None
    if host == socket.gethostname():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except OSError:  # alive, another user's
            pass
    return f"run {run!r} (pid {pid} on {host})"


def _holder(fd: int, wait: float = RECORD_WAIT_S) -> str:
    """Who holds the lock, as its record says: ``run 'demo' (pid 4242 on host)``, waiting up to ``wait`` seconds
    for a holder that has just locked to write it; ``another Watch`` when none comes."""
    deadline = time.monotonic() + wait
    while (described := _described(_record(fd))) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return described or "another Watch"


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (same device and inode)."""
    try:
        here, held = os.stat(path), os.fstat(fd)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino)


def _lock(fd: int) -> None:
    """Take the exclusive lock or raise BlockingIOError. When this process holds it, the holder may be a Watch
    nobody references any more (a notebook cell run again, a Watch never closed): a garbage collection frees its
    lock, so the lock is tried once more after one."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        record = _record(fd)
        if record is None or record.get("pid") != os.getpid():
            raise
        gc.collect()
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


class LogFolderLock:
    """The lock of one log folder, taken on construction (or, when the folder cannot be written then, by `acquire`
    before the first write) and held until ``release``.

    Args:
        folder: The log folder (created if missing).
        run: The run's name, recorded for the refusal another Watch gets.

    Raises:
        FolderInUse: Another Watch holds the folder; the message names its run, process and host.
    """

    def __init__(self, folder: str | Path, run: str):
        self.path = Path(folder) / LOCK_NAME
        self.run = run
        self._fd: int | None = None
        self._unsupported = fcntl is None  # Windows, or a file system without flock: never locked
        self._refused = False
        self._failure: OSError | None = None  # why the last try could not open the lock file
        self.acquire()

    def acquire(self) -> None:
        """Take the folder's lock unless this Watch holds it; a folder that cannot be created or written now is left
        unlocked (writing there fails anyway, and the exporter reports that) and tried again at the next call.

        Raises:
            FolderInUse: Another Watch holds the folder.
        """
        if self._fd is not None or self._unsupported:
            return
        for _ in range(LOCK_TRIES):
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                self._failure = exc
                return
            self._failure = None
            with _TAKING:  # in this process a lock and its holder's record appear together: a refused thread reads
                try:
                    _lock(fd)
                except BlockingIOError:
                    refused = True
                except OSError:  # a file system without flock
                    os.close(fd)
                    self._unsupported = True
                    return
                else:
                    if not _names(self.path, fd):  # its holder removed it as we opened it: lock the new file
                        os.close(fd)
                        continue
                    refused = False
                    self._fd = fd
                    self.rename(self.run)
            break
        else:
            return  # the file kept changing under us: left unlocked, tried again at the next write
        if refused:  # waits for another process's record once: a refused write must not stall each step
            holder = _holder(fd, 0.0 if self._refused else RECORD_WAIT_S)
            self._refused = True
            os.close(fd)
            raise FolderInUse(f"run folder {shown_path(self.path.parent)} is in use by {holder}: one Watch writes a "
                              "run folder; give this run its own (leave run_folder unset) or close the other Watch "
                              "first")

    def claim(self) -> None:
        """Take the lock before writing into the folder, or raise: nothing is written there unlocked.

        Raises:
            FolderInUse: Another Watch holds the folder.
            OSError: The folder cannot be written now (the lock file cannot be created), as the write would fail.
        """
        self.acquire()
        if self._fd is None and not self._unsupported:
            raise self._failure or OSError(f"log_dir {shown_path(self.path.parent)}: its lock file kept changing")

    @property
    def held(self) -> bool:
        """Whether this process holds the folder's lock."""
        return self._fd is not None

    def rename(self, run: str) -> None:
        """Record ``run`` as the holder (a resumed run takes its saved name); a full disk leaves the old record."""
        self.run = run
        if self._fd is None:
            return
        record = json.dumps({"run": run, "pid": os.getpid(), "host": socket.gethostname()}).encode()
        try:  # one write over the whole of the last record: a reader sees the old record or the new, never none
            size = max(RECORD_BYTES, len(record), os.fstat(self._fd).st_size)
            os.pwrite(self._fd, record.ljust(size), 0)
        except OSError:
            pass

    def release(self) -> None:
        """Let another Watch write the folder and leave no lock file in it: the file is removed while still locked
        (a Watch that opened it meanwhile sees it gone once it locks, and takes a new one), then closing the
        descriptor drops the lock. A second call does nothing."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                if _names(self.path, fd):
                    os.unlink(self.path)
            os.close(fd)

    def __del__(self) -> None:  # a Watch whose construction failed later on frees its folder with its exporters
        self.release()


def holder(folder: str | Path) -> str | None:
    """Who writes ``folder`` now (``run 'demo' (pid 4242 on host)``), or None when no Watch holds it."""
    path = Path(folder) / LOCK_NAME
    if fcntl is None or not path.is_file():
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        return _holder(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
