"""What a stored entry holds: the one vocabulary of entry kinds, and who
handles each.

An entry's kind is stored as its string (``EntryKind.GRAPH`` is ``"graph"``
in an entry's body, in ``ltc-cache ls --json`` and wherever it is shown): an
``EntryKind`` is a ``str``, equal to and hashing as its value, and formats
as its value too, on every Python this package supports.

Each kind is handled by the product that owns it. Its registration, a
:class:`KindHandlers` named in :data:`HANDLED_BY`, says how ``ltc-cache``
verifies an entry of it, describes one (``show``) and summarises one for
``ls`` and ``stats``; the report and cli packages dispatch through
:func:`handlers` and name no kind but the default, ``graph``.

Registrations are named, not imported: this module is the ground every
layer stands on, and a registration is resolved only when a command first
meets its kind. A registration module imports torch only inside its
handlers, never at import: ``ls`` and ``stats`` resolve the summarisers of
the kinds they list and must not pay for torch
(tests/common/test_entry_kind_registry.py checks both).

A new kind needs two files:

1. here, its member of EntryKind (its stored string, never changed once
   entries carry it) and its line in HANDLED_BY;
2. in the product that makes its entries, the registration: a module-level
   KindHandlers with ``verify``, ``show`` and ``summarise``, and ``parts``
   and ``fuses`` where they apply.

Nothing in report/ or cli/ changes (tests/common/test_kinds.py lists the
stored strings, and gets the new one).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .graph.entry import Entry

__all__ = ["HANDLED_BY", "KINDS", "EntryKind", "KindHandlers", "KindView", "ShowContext",
           "SummaryParts", "handlers", "handlers_of"]


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

# Each kind's registration: "module:NAME", the module relative to this
# package, NAME a KindHandlers in it.
HANDLED_BY: Mapping[EntryKind, str] = MappingProxyType({
    EntryKind.GRAPH: "graph.graph_kind:GRAPH",
    EntryKind.NEGATIVE: "graph.graph_kind:NEGATIVE",
    EntryKind.PLAN: "compile_backend.plan_kind:PLAN",
    EntryKind.PROGRAM: "program.program_kind:PROGRAM",
    EntryKind.FUSED: "graph.fused.fused_kind:FUSED",
})


@dataclass(frozen=True)
class ShowContext:
    """What a kind's ``show`` may need besides the entry: the secret of
    LTC_CACHE_SECRET (signatures are checked under it), the name of another
    entry listed in the same directory (None where it is not stored there),
    and whether the IR is wanted (``show --no-ir`` leaves it out)."""

    secret: bytes | None
    name_of: Callable[[str], str | None]
    with_ir: bool = True


@dataclass(frozen=True)
class KindView:
    """An entry of one kind as ``show`` gives it: ``payload`` as ``--json``
    shows it (machine code and pickles as their sizes, never their bytes),
    ``fields`` a line each after the fields every entry has, ``lines``
    after them (a graph's layout and IR, or what the kind is), and members
    of its own in the ``--json`` object (``json``)."""

    payload: Mapping[str, Any]
    fields: Sequence[tuple[str, str]]
    lines: Sequence[str]
    json: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SummaryParts:
    """Entries of one kind that ``stats`` counts apart (a fused entry: a
    library this CPU runs, one built for other CPUs, or a refusal): ``field``
    of the listing summary names the part, one of ``names``, in the order
    shown, unless ``classify`` (the summary -> its part, read where the
    listing runs) says more. A summary without ``field`` was written
    before the kind had parts, and its entry is read again."""

    field: str
    names: tuple[str, ...]
    classify: Callable[[Mapping[str, Any]], str] | None = None

    def part_of(self, summary: Mapping[str, Any]) -> str:
        return self.classify(summary) if self.classify else str(summary.get(self.field))


@dataclass(frozen=True)
class KindHandlers:
    """How ``ltc-cache`` handles the entries of ``kind``.

    - ``verify(entry, secret, directory)``: raise EntryError unless the
      decoded entry holds what its kind promises (``verify`` has checked
      the bytes, the key and the IR already); ``secret`` is
      LTC_CACHE_SECRET's, ``directory`` the cache's (or the Redis tier's
      name).
    - ``show(entry, context)``: the :class:`KindView` of ``show``.
    - ``summarise(body)``: listing fields of its own, read from the
      entry's msgpack body without torch and leniently (``ls``, ``stats``;
      stored in the ledger beside the common ones).
    - ``parts``: what ``stats`` counts apart, if anything.
    - ``fuses``: whether ``ltc-cache fuse`` compiles libraries for it
      (entries that hold whole graphs).
    """

    kind: EntryKind
    verify: Callable[[Entry, bytes | None, str | Path], None]
    show: Callable[[Entry, ShowContext], KindView]
    summarise: Callable[[Mapping[str, Any]], dict[str, Any]]
    parts: SummaryParts | None = None
    fuses: bool = False


_resolved: dict[str, KindHandlers] = {}


def handlers(kind: str) -> KindHandlers:
    """The registration of ``kind`` (an EntryKind or its string), imported
    on first use; KeyError for a string that names no kind."""
    found = _resolved.get(kind)
    if found is None:
        module, _, name = HANDLED_BY[kind].partition(":")
        found = getattr(importlib.import_module(f".{module}", __package__), name)
        if not isinstance(found, KindHandlers) or found.kind != kind:
            raise TypeError(f"{HANDLED_BY[kind]} is not the KindHandlers of {kind}")
        _resolved[kind] = found
    return found


def handlers_of(kind: object) -> KindHandlers | None:
    """:func:`handlers` of whatever a summary or a body calls its kind;
    None where that is no kind (a damaged entry, an unreadable one)."""
    if not isinstance(kind, str) or kind not in HANDLED_BY:
        return None
    return handlers(kind)
