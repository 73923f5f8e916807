"""Totals and the counters of every process that used a directory (``ltc-cache stats``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..diagnostics import BACKEND_EVENTS, COUNTER_NAMES
from ..store.disk import DiskStore
from ..units import format_size
from ..wire import is_entry_key
from .listing import ago, shown

__all__ = ["STAT_LABELS", "STAT_NAMES", "StatsReport", "collect_stats"]

# The cache's own events, the directory's evictions, and the torch.compile
# backend's events (diagnostics.BACKEND_EVENTS).
STAT_NAMES = (*COUNTER_NAMES, "evictions", *BACKEND_EVENTS)
STAT_LABELS = {"aot_traces": "AOT traces", "plan_hits": "Plan hits",
               "plan_misses": "Plan misses"}


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

    @property
    def hit_rate(self) -> float | None:
        lookups = self.counters["hits"] + self.counters["misses"]
        return self.counters["hits"] / lookups if lookups else None

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
    for row in store.rows():
        if is_entry_key(row.key):
            entries += 1
            entry_size += row.size
        else:
            internal += 1
            internal_size += row.size
    counters = {name: 0 for name in STAT_NAMES} | store.ledger.counters()
    recorded, limit = store.ledger.size_limit()
    usage = _disk_usage(Path(store.directory)) if isinstance(store, DiskStore) else None
    source = "recorded" if recorded else ("environment" if size_limit else None)
    if not recorded:
        limit = size_limit
    return StatsReport(Path(store.directory), entries, entry_size, internal, internal_size,
                       usage, limit, source, counters,
                       store.ledger.zeroed_at())
