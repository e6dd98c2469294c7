"""Progress bars on a terminal only: redirected to a file, tqdm's redraws fill a log with thousands of lines."""

from __future__ import annotations

import sys


def show_progress(force: bool | None = None) -> bool:
    """Whether to draw progress bars: ``force`` (``--progress``/``--no-progress``) decides when given; otherwise
    only when stderr, where tqdm draws, is a terminal."""
    if force is not None:
        return force
    stream = sys.stderr
    return bool(stream is not None and hasattr(stream, "isatty") and stream.isatty())
