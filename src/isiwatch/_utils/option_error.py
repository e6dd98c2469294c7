"""Refusals of an option, worded for whoever asked: Python parameters for a caller (``keep=K``), flags for the
command line (``--keep K``)."""

from __future__ import annotations

from collections.abc import Mapping

#: The largest value a count option (steps, samples, images, failures, patience) takes: far beyond any real run,
#: and small enough that a typo such as ``patience: 2**70`` is refused instead of silently switching a policy off.
MAX_COUNT = 10**9


class _Name:
    """An option in a message: ``{keep}`` reads ``keep``, ``{keep:K}`` ``keep=K`` (``--keep``, ``--keep K`` as a
    flag)."""

    def __init__(self, name: str, flag: str | None):
        self.name, self.flag = name, flag

    def __format__(self, value: str) -> str:
        if self.flag is None:
            return f"{self.name}={value}" if value else self.name
        return f"{self.flag} {value.strip(chr(39))}" if value else self.flag


class _Names(dict[str, object]):
    def __init__(self, values: Mapping[str, object], flags: Mapping[str, str] | None):
        super().__init__(values)
        self.flags = flags

    def __missing__(self, name: str) -> _Name:
        return _Name(name, None if self.flags is None else self.flags.get(name, f"--{name.replace('_', '-')}"))


class OptionError(ValueError):
    """An impossible option value or combination, refused in one line.

    ``template`` is a `str.format` string whose fields are either ``values`` (paths, numbers) or option
    names (``{keep}``, ``{strategy:'auto'}``); ``str()`` names them as Python parameters and `worded` with
    the command line's flags, so one check serves both.
    """

    def __init__(self, template: str, **values: object):
        self.template, self.values = template, values
        super().__init__(self.worded())

    def worded(self, flags: Mapping[str, str] | None = None) -> str:
        """The message with option names as Python parameters, or as ``flags`` (name → flag; other names
        become ``--name-with-dashes``) when given."""
        return self.template.format_map(_Names(self.values, flags))
