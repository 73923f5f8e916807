"""Checks standing in for identity guards on plain objects.

Dynamo guards an object's identity (``ID_MATCH``) wherever the traced code
reads its ``id()``: ``copy.deepcopy`` keys its memo by ``id(x)``, and
transformers' encoder-decoder models deep-copy their config on every
forward (``config.get_text_config``, fact 32 in docs/design.md). The id of
an object never holds in another process, and a config has no description
that does (:func:`ltc_cache.program.describe` takes classes, functions,
constants). What the trace depended on is the object's class, its
contents (guarded on their own, attribute by attribute) and which of the
objects it saw were one object: an ``object`` check compares the class,
and that the objects the capture saw as one (or as distinct) are one (or
distinct) again; on later calls, that each is the very object it was on
the first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .program import Unportable, describe, portable_check

__all__ = ["OBJECT", "Aliasing", "identity_check"]

OBJECT = "object"
_IDENTITY = frozenset({"ID_MATCH"})


def identity_check(expr: str, guard_type: str, derived: Sequence[str], has_value: bool,
                   value: Any, seen: list[Any]) -> list[Any]:
    """:func:`ltc_cache.program.portable_check`, and for an identity guard
    on an object with no portable description, an ``object`` check:
    ``[expr, "object", [class description, alias]]``, where ``alias``
    numbers the distinct objects in ``seen`` (this capture's, in order).
    Raises Unportable."""
    try:
        return portable_check(expr, guard_type, derived, has_value, value)
    except Unportable:
        if not has_value or not (guard_type in _IDENTITY or "ID_MATCH" in derived):
            raise
    if type(value) is object:
        # A bare ``object()`` is a sentinel: only its identity means anything.
        raise Unportable(f"{guard_type} guard on {expr}: a sentinel object")
    cls = describe(type(value))
    alias = next((i for i, other in enumerate(seen) if other is value), None)
    if alias is None:
        alias = len(seen)
        seen.append(value)
    return [expr, OBJECT, [cls, alias]]


class Aliasing:
    """Compares ``object`` checks on one call: the class, and that the
    objects are one where the capture's were, distinct where they were."""

    def __init__(self) -> None:
        self._bound: dict[int, Any] = {}

    def fits(self, value: Any, expected: Any) -> bool:
        try:
            cls, alias = expected
        except (TypeError, ValueError):
            return False
        if describe(type(value)) != cls:
            return False
        bound = self._bound.get(alias, self)
        if bound is self:
            if any(other is value for other in self._bound.values()):
                return False  # one object where the capture saw two
            self._bound[alias] = value
            return True
        return bound is value
