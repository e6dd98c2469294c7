"""The ``auto`` search's journal: one JSON line per finished candidate, so an interrupted search resumes.

The first line records what the search was asked and on what (source checkpoint, depth, image counts, the
acceptance rule, healing steps, seed); every further line is one candidate as
`isiwatch.truncation.search.Candidate.to_dict` writes it, appended and flushed to disk as soon as the
candidate is scored. ``resume`` reads a journal whose first line matches the present search and hands its
candidates back instead of healing them again; a journal of another search is refused in one line rather than
mixed in. A line cut short by a kill (the last one) is ignored.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .._utils.option_error import OptionError

__all__ = ["SearchJournal", "finished_candidates", "journal_path"]


def journal_path(out: Path) -> Path:
    """Where the journal of a search writing ``out`` lives: beside it, ``OUT.search.jsonl``."""
    return out.with_name(out.name + ".search.jsonl")


def _records(lines: list[str]) -> list[dict[str, Any]]:
    """The candidates of a journal's lines after its first, without the line a kill cut short."""
    records = []
    for line in lines[1:]:
        try:
            records.append(json.loads(line))
        except ValueError:  # the line a kill cut short
            continue
    return records


def finished_candidates(path: Path) -> int:
    """How many finished candidates the journal at ``path`` holds, that a resumed search will not heal again (0:
    no journal there, or one that is not a journal)."""
    try:
        lines = path.read_text().splitlines()
        json.loads(lines[0])
    except (OSError, ValueError, IndexError):
        return 0
    return len(_records(lines))


class SearchJournal:
    """Appends finished candidates to ``path`` (None: keeps them in memory only); with ``resume``, first reads
    those of an earlier run of the same search (``header`` equal) from ``path`` when it exists."""

    def __init__(self, path: Path | None, header: dict[str, Any], resume: bool = False):
        self.path, self.header = path, json.loads(json.dumps(header))  # as it reads back from JSON
        self.finished: dict[tuple[int, ...], dict[str, Any]] = {}
        self.created = False
        if path is None:
            return
        lines = path.read_text().splitlines() if resume and path.exists() else []
        self.created = not lines
        if lines:
            self._read(lines)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._append(self.header, mode="w")

    def _read(self, lines: list[str]) -> None:
        assert self.path is not None
        try:
            earlier = json.loads(lines[0])
        except ValueError:
            raise OptionError("{resume}: {path} is not a search journal (its first line is not JSON)",
                              path=self.path) from None
        differs = sorted(k for k in {*earlier, *self.header} if earlier.get(k) != self.header.get(k))
        if differs:
            raise OptionError("{resume}: {path} journals a different search ({keys} differ); remove it or drop "
                              "{resume}", path=self.path, keys=", ".join(differs))
        for record in _records(lines):
            self.finished[tuple(record["kept_blocks"])] = record

    def _append(self, record: dict[str, Any], mode: str = "a") -> None:
        assert self.path is not None
        with open(self.path, mode) as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def discard(self) -> None:
        """Remove the journal this run started (a refused run, or one interrupted before it finished a candidate,
        leaves none); one it resumed stays."""
        if self.path is not None and self.created:
            self.path.unlink(missing_ok=True)

    def lookup(self, kept: list[int]) -> dict[str, Any] | None:
        """The journalled record of the cut keeping ``kept``, if an earlier run finished it."""
        return self.finished.get(tuple(kept))

    def record(self, candidate: dict[str, Any]) -> None:
        """Append one finished candidate."""
        self.finished[tuple(candidate["kept_blocks"])] = candidate
        if self.path is not None:
            self._append(candidate)
