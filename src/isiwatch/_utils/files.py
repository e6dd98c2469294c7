"""Atomic output: write to a temporary file (or folder) beside the target, then rename it into place.

Temporary names are ``.TARGET.isiwatch-HOST-PID-RANDOM.tmp``: hidden, marked as isiwatch's and as temporary, and
never ending in the target's suffix, so ``*.pt`` or ``*.json`` never matches one. A process killed mid-write
(kill -9, power loss) leaves its temporary behind; the next write of the same target removes those whose
process is gone (same host, PID no longer running), never one that another live writer still uses.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import math
import os
import shlex
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import Buffer

_HOST = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


class WriteError(OSError):
    """An output could not be written; ``str()`` is ``FILE: cannot write (REASON)`` and ``errno`` is kept."""

    def __str__(self) -> str:
        return f"{self.filename}: cannot write ({self.strerror})"


def _write_error(exc: OSError, path: Path) -> WriteError:
    if isinstance(exc, WriteError):
        return exc
    return WriteError(exc.errno or errno.EIO, exc.strerror or str(exc) or type(exc).__name__, str(path))


def _temp_prefix(name: str) -> str:
    return f".{name}.isiwatch-{_HOST}-{os.getpid()}-"


def _alive(pid: int) -> bool:
    if os.name != "posix":  # os.kill(pid, 0) would terminate the process on Windows: treat every writer as live
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it runs, under another user
        return True
    return True


def remove_stale(folder: Path, name: str) -> None:
    """Remove the temporaries of target ``name`` in ``folder`` left by killed isiwatch processes on this host."""
    prefix = f".{name}.isiwatch-{_HOST}-"
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            if not (entry.name.startswith(prefix) and entry.name.endswith(".tmp")):
                continue
            pid = entry.name[len(prefix):].split("-", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)


class _Output(io.RawIOBase):
    """A file whose writes are plain ``os.write`` calls; keeps the first OSError, because torch.save turns it
    into ``RuntimeError: [enforce fail at inline_container.cc] unexpected pos`` that names neither file nor cause."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd = fd
        self.error: OSError | None = None

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            os.close(self.fd)
        super().close()

    def write(self, data: Buffer) -> int:
        view = memoryview(data).cast("B")
        size = view.nbytes
        try:
            while view.nbytes:
                view = view[os.write(self.fd, view):]
        except OSError as exc:
            self.error = self.error or exc
            raise
        return size


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _open_temp(path: Path) -> tuple[str, _Output]:
    """A new temporary file beside ``path``, with the permissions a plain ``open`` would give it."""
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path.name), suffix=".tmp", dir=path.parent)
    raw = _Output(fd)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
    except OSError:
        raw.close()
        os.unlink(tmp)
        raise
    return tmp, raw


@contextlib.contextmanager
def atomic_write(path: str | Path) -> Iterator[io.BufferedWriter]:
    """Yield a binary file that replaces ``path`` only when the block succeeds; nothing is left otherwise.

    Any OSError on the way (a full disk, no permission), even one a writer such as torch.save wraps in its own
    exception, is raised as `WriteError` naming ``path``; the temporary file is removed.
    """
    path = Path(path)
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(path.parent, path.name)
        tmp, raw = _open_temp(path)
        fh: io.BufferedWriter = io.BufferedWriter(raw, buffer_size=1 << 20)
        try:
            yield fh
            fh.close()
        except Exception as exc:
            if raw.error is not None and not isinstance(exc, OSError):
                raise raw.error from exc
            raise
        finally:
            if not fh.closed:  # the block failed: the temporary goes anyway, its last bytes need not
                with contextlib.suppress(Exception):
                    fh.close()
        os.replace(tmp, path)
    except OSError as exc:
        raise _write_error(exc, path) from exc
    finally:
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


@contextlib.contextmanager
def atomic_files(folder: str | Path, last: Sequence[str] = ()) -> Iterator[Path]:
    """Yield a staging folder; the files written there appear in ``folder`` only once the whole block succeeded.

    For outputs that belong together (analysis.json and its curves.png): a failure or kill while writing leaves
    the old files (or none) and no new one. A new ``folder`` is the staging folder renamed, so every file
    appears at once. In an existing ``folder`` (staged inside it: same file system) each file replaces its
    namesake by ``os.replace``, the files named in ``last`` after the others: a new ``last`` file means the
    rest is new too; only a kill between those renames (microseconds) leaves a mix.
    """
    folder = Path(folder)
    home = folder if folder.is_dir() else folder.parent
    stage: Path | None = None
    try:
        home.mkdir(parents=True, exist_ok=True)
        for place in {home, folder.parent}:  # a killed run staged beside the folder if it was new, else inside
            remove_stale(place, folder.name)
        stage = Path(tempfile.mkdtemp(prefix=_temp_prefix(folder.name), suffix=".tmp", dir=home))
        stage.chmod(0o777 & ~_umask())  # mkdtemp's 0700, renamed into place, would hide the outputs from others
        try:
            yield stage
        except WriteError as exc:
            raise WriteError(exc.errno, exc.strerror, exc.filename.replace(str(stage), str(folder))) from None
        names = sorted((p.name for p in stage.iterdir()), key=lambda n: (last.index(n) if n in last else -1, n))
        if home != folder:
            with contextlib.suppress(OSError):
                os.rename(stage, folder)  # fails when someone created folder meanwhile: move file by file
                return
        for name in names:
            os.replace(stage / name, folder / name)
    except OSError as exc:
        raise _write_error(exc, folder) from exc
    finally:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)


def finite_or_none(value: float | None) -> float | None:
    """JSON has no NaN/Inf: non-finite numbers are written as null."""
    return value if value is None or math.isfinite(value) else None


def finite_json(value: object) -> object:
    """``value`` with every non-finite float, at any depth of its dicts, lists and tuples, as None
    (`finite_or_none` for a whole record)."""
    if isinstance(value, float):
        return finite_or_none(value)
    if isinstance(value, dict):
        return {key: finite_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(item) for item in value]
    return value


def write_json(path: str | Path, data: object) -> Path:
    text = json.dumps(data, indent=2, allow_nan=False) + "\n"
    with atomic_write(path) as fh:
        fh.write(text.encode("utf-8"))
    return Path(path)


def reserve_std_fds() -> None:
    """Put ``/dev/null`` on each of descriptors 0–2 that is closed (a daemonised job's), so that no file or socket
    opened later takes one: a log file opened on descriptor 2 would receive everything written to stderr, the
    monitor's own one-line reports among them. What the process writes to a closed stderr is lost either way."""
    for fd in range(3):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: ``fd``, as those below it are open
            if null != fd:  # another thread took ``fd`` meanwhile
                os.close(null)


class PathError(ValueError):
    """A path a command cannot use (an output it must not write, an input that is not there): ``str()`` is one
    line naming the path and the problem."""


def file_identity(path: str | Path) -> object:
    """What makes two paths one file: its device and inode when it exists (a hard link, a symlink or another
    spelling of the path all match), else the resolved path."""
    try:
        info = os.stat(path)
    except OSError:
        return Path(path).resolve()
    return info.st_dev, info.st_ino


def shown_path(path: str | Path) -> str:
    """``path`` for a one-line message: as it is when printable, else quoted with escapes (a newline in a name
    would otherwise split the message)."""
    text = str(path)
    return text if text.isprintable() else repr(text)


def shell_word(path: str | Path) -> str:
    """``path`` as one word to paste into a POSIX shell command: quoted as needed (a space, a quote), and in bash's
    ``$'...'`` form with escapes when it holds a character that is not printable (a line break would split the
    pasted command in two)."""
    text = str(path)
    if text.isprintable():
        return shlex.quote(text)

    def escaped(c: str) -> str:
        if c in "\\'":
            return "\\" + c
        if c.isprintable():
            return c
        code = ord(c)
        return f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"

    return "$'" + "".join(map(escaped, text)) + "'"


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _write_test(folder: Path, name: str) -> OSError | None:
    """Create and remove a temporary file in ``folder`` (named as `atomic_write` names those of target
    ``name``, so a kill in between leaves one the next write removes): the one test that a read-only file system,
    permissions, ACLs and root's privileges all answer as the real write will. None: it can be written."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(name), suffix=".tmp", dir=folder)
    except OSError as exc:
        return exc
    os.close(fd)
    os.unlink(tmp)
    return None


def check_output(path: str | Path, option: str, folder: bool = False) -> Path:
    """Refuse, before any work, an output path isiwatch must not or cannot write: it must name nothing yet or a
    regular file (``folder``: a directory), in a place this process can write (a write test: a read-only file
    system or a folder without write permission is refused here, not when the results are ready). Symbolic links,
    device nodes (``/dev/null``), FIFOs and sockets are refused rather than replaced, and so is a path whose
    parent is a file. ``option`` names the path in the message (``--out``; empty for an argument). Returns
    ``path`` as a Path."""
    path = Path(path)
    want = "a directory" if folder else "a regular file"
    name = f"{option + ' ' if option else ''}{shown_path(path)}"
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:  # ENOTDIR: a parent is a file; EACCES; ENAMETOOLONG
        raise PathError(f"{name}: cannot be written ({exc.strerror})") from None
    if mode is None:
        place = next((p for p in path.absolute().parents if os.path.lexists(p)), Path("/"))
        if not place.is_dir():
            raise PathError(f"{name}: {shown_path(place)} is not a directory")
    elif not (stat.S_ISDIR(mode) if folder else stat.S_ISREG(mode)):
        raise PathError(f"{name}: is {_kind(mode)}, not {want}; give {want} or a path that "
                        "does not exist yet")
    else:  # written inside an existing folder; a file is replaced by a rename in its folder
        place = path if folder else path.absolute().parent
    error = _write_test(place, path.name)
    if error is not None:
        raise PathError(f"{name}: cannot be written ({error.strerror or error})")
    return path


def check_input(path: str | Path, option: str = "", kind: str = "file or directory", directory: bool = True) -> Path:
    """A path a command reads: refused in one line (its name quoted when it holds a newline) when nothing is
    there, or when it is neither a regular file nor (``directory``) a directory: a device such as ``/dev/null``,
    a FIFO or a socket is not a checkpoint. ``option`` names it in the message (empty for an argument), ``kind``
    says what it should be. Symbolic links are followed."""
    path = Path(path)
    name = f"{option + ' ' if option else ''}{shown_path(path)}"
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise PathError(f"{name}: no such {kind}") from None
    except OSError as exc:  # EACCES, ELOOP, ENAMETOOLONG
        raise PathError(f"{name}: cannot be read ({exc.strerror})") from None
    if not (stat.S_ISREG(mode) or (directory and stat.S_ISDIR(mode))):
        raise PathError(f"{name}: is {_kind(mode)}, not a regular file")
    return path


#: Largest isiwatch.yaml read: real ones are a few hundred bytes; a bigger file is refused before YAML builds it
#: (a 25 MB list in a section once took 6 GB of memory before its error).
MAX_CONFIG_BYTES = 1 << 20


def check_size(path: str | Path, limit: int, what: str) -> Path:
    """Refuse a file larger than ``limit`` bytes before it is read; ``what`` says what it should be."""
    path = Path(path)
    with contextlib.suppress(OSError):  # a missing or unreadable file: its reader names the problem
        size = path.stat().st_size
        if size > limit:
            raise PathError(f"{shown_path(path)}: {size:,} bytes is too large for {what} (at most {limit:,})")
    return path
