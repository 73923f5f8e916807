"""Choosing and ordering entries: ``--filter``, ``--sort`` and key prefixes."""

from __future__ import annotations

import fnmatch
import operator
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..entries.kinds import EntryKind
from ..entries.wire import is_entry_key
from ..errors import AmbiguousKey, BadArgument, NoSuchEntry
from ..units import parse_age, parse_size
from .listing import EntryInfo

__all__ = ["SORT_FIELDS", "EntryFilter", "parse_filter", "resolve_key",
           "sort_entries"]

# field -> (attribute, parser, how it compares); "age" compares time since.
_FILTER_FIELDS: dict[str, tuple[str, Callable[[str], Any], str]] = {
    "size": ("size", parse_size, "number"),
    "ops": ("node_count", int, "number"),
    "inputs": ("num_inputs", int, "number"),
    "hits": ("hits", int, "number"),
    "created": ("created", parse_age, "age"),
    "accessed": ("last_used", parse_age, "age"),
    "name": ("graph_name", str, "text"),
    "kind": ("kind", str, "text"),
    "torch": ("torch_version", str, "text"),
    "key": ("key", str, "text"),
    "isa": ("isa", str.upper, "text"),
}
_OPERATORS = {">=": operator.ge, "<=": operator.le, "!=": operator.ne, "==": operator.eq,
              "=": operator.eq, ">": operator.gt, "<": operator.lt}
_FILTER = re.compile(r"\s*([a-z_]+)\s*(>=|<=|!=|==|=|>|<)\s*(.*?)\s*")


@dataclass(frozen=True)
class EntryFilter:
    """``FIELD OP VALUE``: ``size>1MB``, ``accessed>30d`` (not used for 30
    days), ``created<2h``, ``hits=0``, ``name=gpt2*`` (a glob)."""

    text: str
    attribute: str
    op: str
    value: Any
    compare: str

    def __call__(self, entry: EntryInfo, now: float | None = None) -> bool:
        actual = getattr(entry, self.attribute)
        if self.compare == "age":
            actual = (now or time.time()) - actual
        elif self.compare == "text":
            if actual is None:  # an entry without a kind is a graph; one without an ISA no library
                actual = EntryKind.GRAPH if self.attribute == "kind" else ""
            matched = fnmatch.fnmatchcase(str(actual), self.value)
            return matched if self.op in ("=", "==") else not matched
        return _OPERATORS[self.op](actual, self.value)


def parse_filter(text: str) -> EntryFilter:
    """Raises ValueError with the fields and forms it takes."""
    match = _FILTER.fullmatch(text)
    if not match or match.group(1) not in _FILTER_FIELDS:
        raise BadArgument(f"not a filter: {text!r} (FIELD OP VALUE, FIELD one of "
                         f"{', '.join(_FILTER_FIELDS)}; e.g. size>1MB, accessed>30d)")
    name, op, raw = match.groups()
    attribute, parse, compare = _FILTER_FIELDS[name]
    if compare == "text" and op not in ("=", "==", "!="):
        raise BadArgument(f"filter {text!r}: {name} takes = or != (with * and ? globs)")
    try:
        value = parse(raw)
    except ValueError as exc:
        raise BadArgument(f"filter {text!r}: {exc}") from None
    return EntryFilter(text, attribute, op, value, compare)


# field -> (attribute, largest/newest first by default)
SORT_FIELDS: dict[str, tuple[str, bool]] = {
    "accessed": ("last_used", True), "created": ("created", True), "size": ("size", True),
    "hits": ("hits", True), "ops": ("node_count", True), "inputs": ("num_inputs", True),
    "name": ("graph_name", False), "torch": ("torch_version", False), "key": ("key", False),
}


def sort_entries(entries: Iterable[EntryInfo], by: str = "accessed", *,
                 reverse: bool = False) -> list[EntryInfo]:
    attribute, descending = SORT_FIELDS[by]
    return sorted(entries, key=operator.attrgetter(attribute), reverse=descending != reverse)


def resolve_key(keys: Iterable[str], prefix: str) -> str:
    """The one entry key starting with ``prefix``. Raises KeyError where
    none does, AmbiguousKey (a ValueError) where several do."""
    prefix = prefix.strip().lower()
    if not re.fullmatch(r"[0-9a-f]{1,64}", prefix):
        raise BadArgument(f"{prefix!r} is not a key or key prefix (hex digits)")
    candidates = sorted(k for k in keys if is_entry_key(k) and k.startswith(prefix))
    if not candidates:
        raise NoSuchEntry(f"no entry with key {prefix}")
    if len(candidates) > 1:
        raise AmbiguousKey(prefix, candidates)
    return candidates[0]
