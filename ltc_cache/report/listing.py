"""Listing the entries of a cache directory (``ltc-cache ls``).

A listing reads diskcache's index and the ledger's summaries (see
store/ledger.py) and decodes no entry body, so it never imports torch.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

from ..entries.kind_registry import handlers_of, summarise
from ..entries.kinds import EntryKind
from ..entries.wire import is_entry_key
from ..graph.fused.cpu_isa import isa_runs_here
from ..graph.fused.fused_kind import REFUSAL
from ..store.disk import DiskStore
from ..store.ledger import EntryRecord
from ..units import format_age, format_size

__all__ = ["CacheReport", "EntryInfo", "ago", "scan", "shown", "summary_of"]


def ago(timestamp: float | None) -> str:
    """``"3 days ago"``, or ``"never"`` for no time."""
    return format_age(max(0.0, time.time() - timestamp)) if timestamp else "never"


def shown(field: str, show: Callable[[Any], str], none: str | None = None) -> property:
    """A report's readable twin of its raw attribute ``field`` (``size_str``
    of ``size``): a property giving ``show`` of it, or ``none`` where given
    and the attribute is None."""
    def get(self: Any) -> str:
        value = getattr(self, field)
        return none if none is not None and value is None else show(value)

    return property(get)


class EntryInfo(NamedTuple):
    """One row of ``ls``. ``problem`` is set on an entry that cannot be read.

    A named tuple rather than a frozen dataclass: a listing makes one per
    entry, and a tuple is made several times faster (30-50 ms of a
    10,000-entry ``ls``)."""

    key: str
    size: int
    created: float
    last_used: float  # last hit, or when stored if never hit
    hits: int
    graph_name: str = "?"
    kind: str | None = None  # what the entry holds (entries/kinds.py); None where unreadable
    node_count: int = 0
    inputs: Mapping[str, int] = MappingProxyType({})  # source kind -> count
    torch_version: str = "?"
    schema: int | None = None
    problem: str | None = None
    # A fused entry's part: "library", or "refusal" (why there is none);
    # a library's: every vector feature it needs (AVX2, AVX512 AVX512_VNNI, ...).
    fused: str | None = None
    isa: str | None = None
    # A graph's: what its fused library is keyed by (graph/fused/source.py).
    source: str | None = None

    @property
    def short_key(self) -> str:
        return self.key[:12]

    @property
    def num_inputs(self) -> int:
        return sum(self.inputs.values())

    @property
    def runs_here(self) -> bool | None:
        """Whether this CPU runs a fused library; None for any other entry."""
        return None if self.isa is None else isa_runs_here(self.isa)

    @property
    def kind_str(self) -> str:
        """The KIND column of ``ls``: a fused library with the features it
        needs, and whether this CPU lacks them."""
        kind = str(self.kind or EntryKind.GRAPH)
        if self.fused == REFUSAL:
            return f"{kind} refusal"
        if self.isa is not None:
            return f"{kind} {self.isa or 'any CPU'}" + ("" if self.runs_here else " (not here)")
        return kind

    size_str = shown("size", format_size)
    created_str = shown("created", ago)
    last_used_str = shown("last_used", ago)

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key, "graph_name": self.graph_name, "kind": self.kind,
            "node_count": self.node_count, "inputs": dict(self.inputs),
            "num_inputs": self.num_inputs, "size": self.size, "size_str": self.size_str,
            "created": self.created, "created_str": self.created_str,
            "last_used": self.last_used, "last_used_str": self.last_used_str,
            "hits": self.hits, "torch_version": self.torch_version, "schema": self.schema,
            "problem": self.problem, "fused": self.fused, "isa": self.isa,
            "runs_here": self.runs_here,
        }


@dataclass(frozen=True)
class CacheReport:
    directory: Path
    entries: tuple[EntryInfo, ...]
    internal_records: int  # values under keys that are not entry keys
    internal_size: int
    scanned_at: float
    internal_keys: tuple[str, ...] = ()  # what `clear` deletes besides the entries


def _summary(store: DiskStore, key: str) -> dict[str, Any] | None:
    """The listing fields of an entry stored without a ledger summary, read
    from its bytes; None where it was deleted since the index was read."""
    try:
        data = store.peek(key)
    except Exception as exc:  # a missing value file, a refused mode
        return {"problem": f"cannot read ({type(exc).__name__}: {exc})"}
    return None if data is None else summarise(data)


def summary_of(store: DiskStore, key: str, record: EntryRecord | None) -> Mapping[str, Any] | None:
    """The listing fields of entry ``key``: its ledger ``record``'s summary,
    else read from its bytes; None where it was deleted meanwhile."""
    summary = record.summary if record else None
    if summary is None:
        return _summary(store, key)
    # An entry summarised before its kind's summary named its part (a
    # fused library or refusal) is read once more too.
    handled = handlers_of(summary.get("kind"))
    if handled is not None and handled.parts and handled.parts.field not in summary:
        return _summary(store, key)
    return summary


def scan(store: DiskStore) -> CacheReport:
    """Every entry of the directory, from the index and the ledger; only an
    entry stored without a summary is read (and a bad one becomes a warning)."""
    try:
        records = store.ledger.entries()
    except (sqlite3.Error, OSError):  # no summaries to be had: the entries are read instead
        records = {}
    entries, internal, internal_size = [], [], 0
    for key, size, stored, accessed in store.rows():
        if not is_entry_key(key):
            internal.append(key)
            internal_size += size
            continue
        record = records.get(key)
        summary = summary_of(store, key, record)
        if summary is None:
            continue
        entries.append(EntryInfo(
            key=key,
            size=size,
            created=float(summary.get("created") or stored),
            last_used=max(accessed, record.last_used or 0.0) if record else accessed,
            hits=record.hits if record else 0,
            graph_name=str(summary.get("graph_name", "?")),
            kind=summary.get("kind"),
            node_count=int(summary.get("node_count") or 0),
            inputs=dict(summary.get("inputs") or {}),
            torch_version=str(summary.get("torch_version", "?")),
            schema=summary.get("schema"),
            problem=summary.get("problem"),
            fused=summary.get("fused"),
            isa=summary.get("isa") if isinstance(summary.get("isa"), str) else None,
            source=summary.get("source") if isinstance(summary.get("source"), str) else None,
        ))
    return CacheReport(Path(store.directory), tuple(entries), len(internal), internal_size,
                       time.time(), tuple(internal))
