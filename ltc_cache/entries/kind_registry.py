"""Who handles each entry kind: registrations declared by the products.

Each kind is handled by the product that owns it. Its registration, a
:class:`KindHandlers` the product passes to :func:`register` when its
registration module is imported (a module named after its kind:
``graph/graph_kind.py``, ``graph/fused/fused_kind.py``,
``compile_backend/plan_kind.py``, ``program/program_kind.py``), says how
``ltc-cache`` verifies an entry of it, describes one (``show``) and
summarises one for ``ls`` and ``stats``; the report and cli packages
dispatch through :func:`handlers` and name no kind but the default,
``graph``.

This layer names no product: the products register downward. A product
imports its registration module where it makes entries of its kind, and
``ltc_cache.report`` imports every one, so whatever reads a cache knows
every kind. A registration module imports torch only inside its handlers,
never at import: ``ls`` and ``stats`` read the summarisers of the kinds they
list and must not pay for torch (tests/common/test_entry_kind_registry.py
checks both).

A new kind needs two files:

1. ``kinds.py``: its member of EntryKind (its stored string, never changed
   once entries carry it);
2. in the product that makes its entries, the registration module: a
   module-level KindHandlers with ``verify``, ``show`` and ``summarise``,
   and ``parts`` and ``fuses`` where they apply, passed to
   :func:`register`; imported by the product's modules that make such
   entries, and by ``ltc_cache/report/__init__.py``.

Nothing else in report/ or cli/ changes (tests/common/test_kinds.py lists
the stored strings, and gets the new one).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..errors import KindNotRegistered, WrongType
from ..store import ledger
from .kinds import EntryKind
from .wire import unpack

if TYPE_CHECKING:
    from .entry import Entry

__all__ = ["KindHandlers", "KindView", "ShowContext", "SummaryParts", "handlers",
           "handlers_of", "register", "registered", "summarise"]


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


_registered: dict[EntryKind, KindHandlers] = {}


def register(handled: KindHandlers) -> KindHandlers:
    """Declare ``handled`` the registration of its kind (a product's
    registration module does, at import); returns it. A kind has one
    registration: another for a kind already registered raises TypeError."""
    if not isinstance(handled, KindHandlers) or not isinstance(handled.kind, EntryKind):
        raise WrongType(f"{handled!r} is not the KindHandlers of an EntryKind")
    known = _registered.setdefault(handled.kind, handled)
    if known is not handled:
        raise WrongType(f"{handled.kind} is registered already, by {known.show.__module__}")
    return handled


def registered() -> Mapping[EntryKind, KindHandlers]:
    """Every registration made so far in this process, by kind."""
    return MappingProxyType(dict(_registered))


def handlers(kind: str) -> KindHandlers:
    """The registration of ``kind`` (an EntryKind or its string); KeyError
    for a string that names no kind, or a kind whose product has not been
    imported (``ltc_cache.report`` imports every one)."""
    found = _registered.get(kind)  # an EntryKind hashes as its string
    if found is None:
        raise KindNotRegistered(f"{kind!r}: no registration (a kind's product registers it when "
                       "its registration module is imported)")
    return found


def handlers_of(kind: object) -> KindHandlers | None:
    """:func:`handlers` of whatever a summary or a body calls its kind;
    None where that is no kind (a damaged entry, an unreadable one) or no
    registered one."""
    if not isinstance(kind, str):
        return None
    return _registered.get(kind)


def summarise(data: bytes) -> dict[str, Any]:
    """The listing fields of entry bytes, read leniently (any schema, no
    checksum): graph_name, kind, node_count, inputs (count per source kind),
    created, torch_version, schema and size; and the fields of the entry's
    kind (its registration's ``summarise``: a fused entry's ``fused``,
    whether it holds a ``library`` or is a ``refusal``). ``problem`` where
    the bytes are not an entry at all. For display only: ``ltc-cache
    verify`` checks."""
    try:
        envelope = unpack(data)
        body = unpack(envelope["body"])
        meta = body["meta"]
        kind = body.get("kind", meta.get("kind"))  # schema 1: in meta
        handled = handlers_of(kind)
        own = handled.summarise(body) if handled is not None else {}
        return {
            "graph_name": str(meta.get("graph_name", "?")),
            "kind": kind,
            "node_count": int(meta.get("node_count", 0)),
            "inputs": dict(Counter(str(source[0]) for source in body.get("inputs") or ())),
            "created": float(meta.get("created", 0.0)),
            "torch_version": str(meta.get("torch_version", "?")),
            "schema": envelope.get("schema"),
            "size": len(data),
            **own,
        }
    except Exception as exc:  # any shape of garbage
        return {"size": len(data), "problem": f"unreadable entry ({type(exc).__name__}: {exc})"}


# The ledger writes an entry's listing summary when the entry is stored.
ledger.summarise_entries_with(summarise)
