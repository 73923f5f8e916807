"""The checks that stand in for guards Dynamo cannot save: what an object
is (:func:`portable_check`: a class, function or module by its description,
a constant by value), and identity guards on plain objects
(:func:`identity_check`).

Dynamo guards an object's identity (``ID_MATCH``) wherever the traced code
reads its ``id()``: ``copy.deepcopy`` keys its memo by ``id(x)``, and
transformers' encoder-decoder models deep-copy their config on every
forward (``config.get_text_config``, docs/torch/dynamo.md#deepcopy-makes-identity-guards). The id of
an object never holds in another process, and a config has no description
that does (:func:`ltc_cache.program.describe.describe` takes classes, functions,
constants). What the trace depended on is the object's class, its
contents (guarded on their own, attribute by attribute) and which of the
objects it saw were one object: an ``object`` check compares the class,
and that the objects the capture saw as one (or as distinct) are one (or
distinct) again; on later calls, that each is the very object it was on
the first.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

from ..errors import Unportable
from .describe import SIMPLE, describe

__all__ = ["OBJECT", "Aliasing", "identity_check", "portable_check"]

OBJECT = "object"
_IDENTITY = frozenset({"ID_MATCH"})


def identity_check(expr: str, guard_type: str, derived: Sequence[str], has_value: bool,
                   value: Any, seen: list[Any]) -> list[Any]:
    """:func:`portable_check`, and for an identity guard
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


# Guard kinds a check can take the place of, and what it compares.
_IDENTITY_GUARDS = frozenset({"ID_MATCH", "CLASS_MATCH", "FUNCTION_MATCH", "CLOSURE_MATCH",
                              "MODULE_MATCH", "BUILTIN_MATCH"})


_VALUE_GUARDS = frozenset({"CONSTANT_MATCH", "EQUALS_MATCH"})


def portable_check(expr: str, guard_type: str, derived: Sequence[str], has_value: bool,
                   value: Any) -> list[Any]:
    """The check that stands in for a guard Dynamo cannot save: ``[expr,
    kind, expected]``, where ``expr`` is the guard's source (``L[...]``,
    ``G[...]``). ``same``: the object is described alike on load and is the
    very object on each later call; ``eq``: equal to a constant; ``type``:
    of a class described alike; ``len``: of a length. Raises Unportable."""
    if not has_value:
        raise Unportable(f"{guard_type} guard on {expr} has no value to compare")
    if guard_type in _IDENTITY_GUARDS or "ID_MATCH" in derived:
        return [expr, "same", describe(value)]
    if guard_type in _VALUE_GUARDS:
        if not isinstance(value, SIMPLE) and not isinstance(value, enum.Enum):
            raise Unportable(f"{guard_type} guard on {expr}: a {type(value).__name__}")
        return [expr, "same" if isinstance(value, enum.Enum) else "eq", describe(value)]
    if guard_type == "TYPE_MATCH":
        return [expr, "type", describe(type(value))]
    if guard_type == "SEQUENCE_LENGTH":
        return [expr, "len", len(value)]
    raise Unportable(f"{guard_type} guard on {expr}")
