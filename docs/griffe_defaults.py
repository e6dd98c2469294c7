"""A griffe extension for the API reference: a parameter or field whose default names a module-level constant
(``max_drop: float = DEFAULT_MAX_DROP``) is shown with the constant's value (``1.0``), the value a caller gets."""

from __future__ import annotations

from typing import Any

import griffe


class RealDefaults(griffe.Extension):
    """Replaces each default that is a name (or a dotted name) of a constant with that constant's value."""

    def on_package(self, *, pkg: griffe.Module, **_: Any) -> None:
        self._visit(pkg, pkg.modules_collection, set())

    def _visit(self, obj: griffe.Object, collection: Any, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        for member in obj.members.values():
            if member.is_alias:
                continue
            if isinstance(member, griffe.Function):
                for parameter in member.parameters:
                    parameter.default = _value(parameter.default, collection)
            elif isinstance(member, griffe.Attribute) and member.parent is not None and member.parent.is_class:
                member.value = _value(member.value, collection)
            if isinstance(member, (griffe.Module, griffe.Class)):
                self._visit(member, collection, seen)


def _value(default: Any, collection: Any) -> Any:
    """The constant's own value expression when ``default`` names one, else ``default`` unchanged."""
    if not isinstance(default, (griffe.ExprName, griffe.ExprAttribute)):
        return default
    try:
        target = collection[default.canonical_path]
        while target.is_alias:
            target = target.final_target
    except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return default
    if isinstance(target, griffe.Attribute) and target.value is not None and not target.parent.is_class:
        return _value(target.value, collection)
    return default
