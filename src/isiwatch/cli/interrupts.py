"""SIGTERM and SIGINT as an exception a command can answer: what a scheduler (SLURM, Kubernetes, ``timeout``) sends
would otherwise end the process at once, with status 143, no word and nothing cleaned up.

Installed by a command around its work only (`raising_interrupts`), never by the library: a Python caller keeps
its own handlers.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["Interrupted", "raising_interrupts"]

#: The signals `raising_interrupts` turns into `Interrupted`.
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(KeyboardInterrupt):
    """A SIGTERM or SIGINT arrived. A ``KeyboardInterrupt``, so everything that cleans up after Ctrl-C (atomic
    writes' temporaries, DataLoader workers, progress bars) does so for SIGTERM too."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.name = signal.Signals(signum).name

    @property
    def status(self) -> int:
        """The exit status of a process this signal ended, as shells report it: 128 + the signal's number."""
        return 128 + int(signal.Signals[self.name])


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)


@contextmanager
def raising_interrupts() -> Iterator[None]:
    """SIGTERM and SIGINT raise `Interrupted` inside the block; the previous handlers are restored after it. A
    signal ignored when the block starts (a background job of a script ignores SIGINT) stays ignored, and outside
    the main thread (where Python cannot set handlers) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    try:
        for s, handler in previous.items():
            if handler is not signal.SIG_IGN:
                signal.signal(s, _raise)
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
