"""Checks for ``load_state_dict``: a state is validated whole before anything is assigned, so a bad one raises
one ``ValueError`` naming the field and leaves the object as it was."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

#: A field check: a predicate and what the value must be, for the message.
Check = tuple[Callable[[object], bool], str]


def is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_span(value: object) -> bool:
    return (isinstance(value, (list, tuple)) and len(value) == 2 and all(is_count(v) for v in value)
            and value[0] <= value[1])


def optional(check: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: value is None or check(value)


PRESENT: Check = (lambda value: True, "present")
COUNT: Check = (is_count, "an int >= 0")
NUMBER: Check = (is_number, "a number")
SPAN: Check = (optional(is_span), "null or [start, end] with 0 <= start <= end")


def checked(state: object, where: str, **checks: Check) -> dict[str, Any]:
    """The fields of ``state`` named in ``checks``, each validated; ``where`` names the state in the message."""
    if not isinstance(state, Mapping):
        raise ValueError(f"invalid {where}: expected a dict, got {type(state).__name__}")
    for key, (check, expected) in checks.items():
        if key not in state:
            raise ValueError(f"invalid {where}: {key!r} is missing")
        if not check(state[key]):
            raise ValueError(f"invalid {where}: {key!r} must be {expected}, got {state[key]!r}")
    return {key: state[key] for key in checks}
