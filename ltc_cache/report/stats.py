"""Totals and the counters of every process that used a directory (``ltc-cache stats``)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..counter_names import COUNTERS, EVICTIONS, HITS, MISSES
from ..diagnostics import BACKEND_EVENTS, COUNTER_NAMES
from ..entries.kind_registry import SummaryParts, handlers_of
from ..entries.kinds import EntryKind
from ..entries.wire import KINDS, is_entry_key
from ..store.disk import DiskStore, StoredRow
from ..units import format_size
from .listing import ago, shown, summary_of

__all__ = ["STAT_LABELS", "STAT_NAMES", "KindTotal", "StatsReport", "collect_stats"]

# The cache's own events, the directory's evictions, and the torch.compile
# backend's events (diagnostics.BACKEND_EVENTS).
STAT_NAMES = (*COUNTER_NAMES, EVICTIONS, *BACKEND_EVENTS)
# Their labels where not the name capitalised (counter_names.py's).
STAT_LABELS = {name: COUNTERS[name].label for name in STAT_NAMES if COUNTERS[name].label}


@dataclass(frozen=True)
class KindTotal:
    """The entries of one kind (entries/kinds.py; "unreadable" for entries that
    are not) and their bytes; the parts its kind counts apart (a fused
    entry's libraries and refusals: SummaryParts) in ``parts``."""

    kind: str
    entries: int
    size: int
    parts: tuple[KindTotal, ...] = ()

    size_str = shown("size", format_size)

    def as_dict(self) -> dict[str, Any]:
        return {"entries": self.entries, "size": self.size, "size_str": self.size_str,
                **{part.kind: part.as_dict() for part in self.parts}}


@dataclass(frozen=True)
class StatsReport:
    directory: Path
    entries: int
    entry_size: int
    internal_records: int
    internal_size: int
    disk_usage: int | None  # every file under the directory; None for Redis
    size_limit: int | None
    # Where the limit comes from: "recorded" (by the processes that store in
    # the directory), "environment" (LTC_CACHE_MAX_SIZE of this process), or
    # None where no storing process recorded one and none is set here.
    size_limit_source: str | None
    counters: Mapping[str, int]  # STAT_NAMES, across every process using the directory
    zeroed_at: float | None
    # Entries and bytes per kind, from the listing summaries; empty for
    # Redis, which keeps none (its entries would all have to be read).
    kinds: tuple[KindTotal, ...] = ()

    @property
    def hit_rate(self) -> float | None:
        lookups = self.counters[HITS] + self.counters[MISSES]
        return self.counters[HITS] / lookups if lookups else None

    @property
    def hit_rate_str(self) -> str:
        rate = self.hit_rate
        return "-" if rate is None else f"{100 * rate:.1f} %"

    entry_size_str = shown("entry_size", format_size)
    internal_size_str = shown("internal_size", format_size)
    disk_usage_str = shown("disk_usage", format_size, none="-")
    size_limit_str = shown("size_limit", format_size, none="none")
    zeroed_at_str = shown("zeroed_at", ago)

    def as_dict(self) -> dict[str, Any]:
        return {
            "directory": str(self.directory), "entries": self.entries,
            "entry_size": self.entry_size, "entry_size_str": self.entry_size_str,
            "internal_records": self.internal_records, "internal_size": self.internal_size,
            "disk_usage": self.disk_usage, "disk_usage_str": self.disk_usage_str,
            "size_limit": self.size_limit, "size_limit_source": self.size_limit_source,
            "counters": dict(self.counters),
            "hit_rate": self.hit_rate, "zeroed_at": self.zeroed_at,
            "kinds": {total.kind: total.as_dict() for total in self.kinds},
        }


def _disk_usage(directory: Path) -> int:
    total = 0
    stack = [os.fspath(directory)]
    while stack:
        with os.scandir(stack.pop()) as it:
            for item in it:
                if item.is_dir(follow_symlinks=False):
                    stack.append(item.path)
                elif item.is_file(follow_symlinks=False):
                    total += item.stat(follow_symlinks=False).st_size
    return total


def collect_stats(store: DiskStore, *, size_limit: int | None = None) -> StatsReport:
    """Counts and bytes from diskcache's index, counters from the ledger;
    no entry is read. The size limit is the one the storing processes
    recorded in the directory; ``size_limit`` (this process's setting) only
    where none did."""
    entries = entry_size = internal = internal_size = 0
    rows = store.rows()
    for row in rows:
        if is_entry_key(row.key):
            entries += 1
            entry_size += row.size
        else:
            internal += 1
            internal_size += row.size
    kinds = _kind_totals(store, rows) if isinstance(store, DiskStore) else ()
    counters = {name: 0 for name in STAT_NAMES} | store.ledger.counters()
    recorded, limit = store.ledger.size_limit()
    usage = _disk_usage(Path(store.directory)) if isinstance(store, DiskStore) else None
    source = "recorded" if recorded else ("environment" if size_limit else None)
    if not recorded:
        limit = size_limit
    return StatsReport(Path(store.directory), entries, entry_size, internal, internal_size,
                       usage, limit, source, counters,
                       store.ledger.zeroed_at(), kinds)


def _kind_totals(store: DiskStore, rows: Sequence[StoredRow]) -> tuple[KindTotal, ...]:
    """Entries and bytes per kind, from the ledger's summaries; only an
    entry stored without one is read (as ``ls`` does)."""
    try:
        records = store.ledger.entries()
    except (sqlite3.Error, OSError):
        records = {}
    totals: dict[str, list[int]] = {}  # kind -> [entries, bytes]
    parts: dict[str, dict[str, list[int]]] = {}  # kind -> part -> [entries, bytes]
    for row in rows:
        if not is_entry_key(row.key):
            continue
        summary = summary_of(store, row.key, records.get(row.key))
        if summary is None:  # deleted since the index was read
            continue
        kind = ("unreadable" if summary.get("problem")
                else str(summary.get("kind") or EntryKind.GRAPH))
        _add(totals, kind, row.size)
        split = _parts(kind)
        if split is not None:
            _add(parts.setdefault(kind, {}), split.part_of(summary), row.size)
    order = [*(kind for kind in KINDS if kind in totals), *sorted(set(totals) - set(KINDS))]
    return tuple(KindTotal(kind, *totals[kind], parts=_part_totals(kind, parts.get(kind, {})))
                 for kind in order)


def _parts(kind: str) -> SummaryParts | None:
    handled = handlers_of(kind)
    return handled.parts if handled is not None else None


def _part_totals(kind: str, counted: dict[str, list[int]]) -> tuple[KindTotal, ...]:
    """A KindTotal per part of ``kind``, in its order, none missing."""
    split = _parts(kind)
    return () if split is None else tuple(KindTotal(part, *counted.get(part, [0, 0]))
                                          for part in split.names)


def _add(totals: dict[str, list[int]], name: str, size: int) -> None:
    total = totals.setdefault(name, [0, 0])
    total[0] += 1
    total[1] += size
