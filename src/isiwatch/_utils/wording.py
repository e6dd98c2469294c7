"""Words shared by every line that states a figure, so the terminal, the records and the report say it alike."""

from __future__ import annotations

__all__ = ["counted", "points"]


def points(value: float, spec: str = "g") -> str:
    """Accuracy points with their unit, singular for exactly one: ``points(1.0)`` "1 point", ``points(2.5, ".2f")``
    "2.50 points"; ``spec`` formats the number."""
    return f"{value:{spec}} point{'' if value == 1 else 's'}"


def counted(count: int, noun: str) -> str:
    """A count with its noun, singular for exactly one: ``counted(1, "finished candidate")`` "1 finished
    candidate", ``counted(2, ...)`` "2 finished candidates"."""
    return f"{count} {noun}" + ("" if count == 1 else "s")
