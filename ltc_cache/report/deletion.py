"""Deletion plans (``prune``, ``clear``): what goes and why, shown before it happens."""

from __future__ import annotations

import operator
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..graph.fused.cpu_isa import missing_features
from ..store.disk import DiskStore
from ..units import format_size
from .listing import CacheReport, EntryInfo
from .show_and_verify import Progress

__all__ = ["DeletePlan", "plan_clear", "plan_prune", "remove_free_lock_files"]

# Keys deleted per DiskStore.discard call, so a progress bar moves.
_CHUNK = 256


@dataclass(frozen=True)
class DeletePlan:
    """Entries to delete, each with why; nothing happens until ``execute``."""

    entries: tuple[EntryInfo, ...]
    reasons: Mapping[str, str]
    # Internal records (per-name key records, the op-support record): only
    # `clear` deletes them.
    records: tuple[str, ...] = ()
    records_size: int = 0

    @property
    def expected_freed_size(self) -> int:
        return sum(e.size for e in self.entries) + self.records_size

    @property
    def expected_freed_size_str(self) -> str:
        return format_size(self.expected_freed_size)

    def execute(self, store: DiskStore, *, progress: Progress | None = None) -> int:
        """Delete the planned entries; returns how many were still there."""
        keys = [e.key for e in self.entries]
        removed = 0
        for start in range(0, len(keys), _CHUNK):
            chunk = keys[start:start + _CHUNK]
            removed += len(store.discard(chunk))
            if progress:
                progress(len(chunk))
        store.discard(self.records)
        return removed


def plan_prune(report: CacheReport, *, max_size: int | None = None,
               older_than: float | None = None, stale: bool = False,
               cpus: Sequence[frozenset[str]] = (), now: float | None = None) -> DeletePlan:
    """Entries of another torch version or entry schema (``stale``), not
    used for ``older_than`` seconds, fused libraries that none of ``cpus``
    (each a set of vector features) runs, and then the least recently used
    until the rest fit in ``max_size`` bytes."""
    now = now or time.time()
    reasons: dict[str, str] = {}
    if cpus:
        for e in report.entries:
            if e.isa is not None and all(missing_features(e.isa, cpu) for cpu in cpus):
                reasons[e.key] = f"a library for {e.isa}, which none of the CPUs given has"
    if stale:
        import torch

        from ..entries.wire import SCHEMA_VERSION

        for e in report.entries:
            if e.problem:
                continue  # unreadable: `verify --fix` is for those
            if e.schema != SCHEMA_VERSION:
                reasons[e.key] = f"entry schema {e.schema}, not {SCHEMA_VERSION}"
            elif e.torch_version != torch.__version__:
                reasons[e.key] = f"torch {e.torch_version}, not {torch.__version__}"
    if older_than is not None:
        for e in report.entries:
            if e.key not in reasons and now - e.last_used > older_than:
                reasons[e.key] = f"last used {e.last_used_str}"
    if max_size is not None:
        kept = [e for e in report.entries if e.key not in reasons]
        total = sum(e.size for e in kept)
        for e in sorted(kept, key=operator.attrgetter("last_used")):
            if total <= max_size:
                break
            reasons[e.key] = f"least recently used (over {format_size(max_size)})"
            total -= e.size
    return DeletePlan(tuple(e for e in report.entries if e.key in reasons), reasons)


def plan_clear(report: CacheReport) -> DeletePlan:
    """Every entry and every internal record: a cleared cache starts over."""
    return DeletePlan(report.entries, {e.key: "clear" for e in report.entries},
                      report.internal_keys, report.internal_size)


def remove_free_lock_files(directory: Path) -> int:
    """Delete the lock files in ``directory/locks`` that no process holds
    (each taken without waiting, then removed); returns how many. A held
    one stays: removing it would let a second process lock a new file of
    the same name while the first still traces."""
    import filelock

    removed = 0
    locks = Path(directory) / "locks"
    for path in sorted(locks.glob("*.lock")) if locks.is_dir() else ():
        lock = filelock.FileLock(str(path), timeout=0)
        try:
            with lock:
                path.unlink(missing_ok=True)
                removed += 1
        except (filelock.Timeout, OSError):
            continue
    return removed
