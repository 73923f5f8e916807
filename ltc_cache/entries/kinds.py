"""What a stored entry holds: the one vocabulary of entry kinds.

An entry's kind is stored as its string (``EntryKind.GRAPH`` is ``"graph"``
in an entry's body, in ``ltc-cache ls --json`` and wherever it is shown): an
``EntryKind`` is a ``str``, equal to and hashing as its value, and formats
as its value too, on every Python this package supports. How each kind is
handled is its product's registration (:mod:`.kind_registry`).
"""

from __future__ import annotations

from enum import Enum

__all__ = ["KINDS", "EntryKind"]


class EntryKind(str, Enum):
    """A replayable graph (IR and layout), a negative entry (why LTC could
    not extract the graph, or why a program is not kept), a partitioning
    plan (plan.py, joint.py), a whole program (program/program_entries.py),
    a graph's fused library or why it has none (graph/fused/library_entries.py)."""

    GRAPH = "graph"
    NEGATIVE = "negative"
    PLAN = "plan"
    PROGRAM = "program"
    FUSED = "fused"

    # As StrEnum (Python 3.11+) does: the value, not "EntryKind.GRAPH", in
    # str(), f-strings and %-formatting.
    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


# Every kind, in the order ``ltc-cache stats`` shows them.
KINDS = tuple(EntryKind)
