"""The entries of one cache configuration: look one up, store one, drop a
bad one, count what happened, and let one process make a key at a time.

Every product's entries go through an :class:`EntryCache`: a graph's (the
:class:`~ltc_cache.graph.cache.GraphCache`, which extends it), a fused
library's, a partitioning plan's, a program's. It is best effort: a store or
decode failure never breaks the user's model. It warns once, counts an
error, and the caller makes what it looked for.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from ..config import CacheConfig
from ..counter_names import ERRORS, HITS, STORES
from ..diagnostics import count_event, warn_once
from ..errors import EntryError, LockTimeout
from ..store import Store, TieredStore, open_tiers
from . import kind_registry  # noqa: F401 - the ledger summarises what is stored here
from .entry import Entry, decode, encode
from .keys import CacheKey

__all__ = ["EntryCache"]


class EntryCache:
    """Entries of one cache configuration.

    ``store`` overrides the tiers ``config`` would open (tests use a
    MemoryStore).
    """

    def __init__(self, config: CacheConfig | None = None, store: Store | None = None) -> None:
        self.config = config or CacheConfig.from_env()
        self._store = store
        self._store_opened = store is not None
        self._open_lock = threading.Lock()
        # Set too when the directory turns out not to be writable.
        self._readonly = self.config.readonly

    def __deepcopy__(self, memo: dict[int, Any]) -> EntryCache:
        return self  # one open store per directory, shared as the backend is

    @property
    def store(self) -> Store | None:
        """The storage tiers, opened on first use; None when they cannot be."""
        with self._open_lock:
            if not self._store_opened:
                self._store_opened = True
                self._open_store()
            return self._store

    @property
    def readonly(self) -> bool:
        """Whether this cache writes nothing: LTC_CACHE_READONLY, or (once
        ``store`` has been opened) a directory that turned out unwritable."""
        return self._readonly

    def _open_store(self) -> None:
        # A remote hit is decoded (checksum, signature, key) before it is
        # copied to disk, so a bad entry in the shared tier never lands in
        # the local one.
        secret = self.config.secret
        tiers = open_tiers(self.config, verify=lambda key, data: decode(
            data, expected_key=key, secret=secret))
        self._store, self._readonly = tiers.store, tiers.readonly
        for topic, message in tiers.errors:  # counted in the store opened, if any
            self._error(topic, message)

    def lookup_entry(self, key: CacheKey, *, local_only: bool = False,
                     count: bool = True) -> Entry | None:
        """The entry stored under ``key``, decoded and checked, for entries
        that hold no graph of their own (a partitioning plan, a program, a
        fused library), or read to be compiled. None on a miss; a bad entry
        is warned about and dropped, as a graph's is. ``local_only`` leaves
        the shared tier out; ``count`` counts a hit."""
        store = self._tier(local_only)
        if store is None:
            return None
        try:
            data = store.get(key.digest)
            entry = decode(data, expected_key=key.digest,
                           secret=self.config.secret) if data is not None else None
        except EntryError as exc:
            return self._corrupt(store, key.digest, str(exc))
        except Exception as exc:
            return self._error("read", f"cannot read the cache ({exc}); continuing without it"
                               f"{self._where()}")
        if entry is not None and count:
            self.record(HITS, key.digest)
        return entry

    def store_entry(self, entry: Entry, key: CacheKey, *, local_only: bool = False) -> None:
        """Store an entry under ``key`` (unless the cache is read-only);
        ``local_only`` leaves the shared tier out."""
        store = self._tier(local_only)
        if store is not None:
            self._put(store, entry)
            self._remember_name(store, key, entry.graph_name)

    def record(self, event: str, key: str | None = None) -> None:
        """Count ``event`` (of entry ``key``) for this process and, for the
        events a ledger keeps, in the store too (through
        :func:`~ltc_cache.diagnostics.count_event`). A read-only cache writes
        nothing, counters included."""
        count_event(event, None if self._readonly else self._store, key)

    def _tier(self, local_only: bool) -> Store | None:
        store = self.store
        return store.local if local_only and isinstance(store, TieredStore) else store

    def drop_entry(self, key: CacheKey, problem: str, *, local_only: bool = False,
                   remade: str = "traced") -> None:
        """Warn about and delete an entry found unusable after decoding
        (``local_only``: from the tier it was read from, not the shared one;
        ``remade``: how it will be made again, for the warning)."""
        store = self._tier(local_only)
        if store is not None:
            self._corrupt(store, key.digest, problem, remade)

    @contextlib.contextmanager
    def single_flight(self, store: Store, key: str) -> Iterator[None]:
        """One process makes ``key``'s entry while the others wait, then load."""
        with contextlib.ExitStack() as held:
            if not self._readonly:
                try:
                    held.enter_context(store.lock(key, self.config.lock_timeout))
                except LockTimeout as exc:
                    warn_once("lock-timeout", f"{exc}; tracing in this process too "
                              "(LTC_CACHE_LOCK_TIMEOUT sets the wait)")
                except OSError as exc:
                    self._error("lock", f"cannot lock in the cache directory ({exc}); "
                                f"tracing without the lock{self._where()}")
            yield

    def _corrupt(self, store: Store, key: str, problem: str, remade: str = "traced") -> None:
        """Warn, count, and drop a bad entry, so the look after the lock
        misses cleanly and the trace replaces it."""
        self._error("corrupt", f"{problem}; it will be {remade} again{self._where()}")
        if not self._readonly:
            with contextlib.suppress(Exception):
                store.delete(key)

    def _put(self, store: Store, entry: Entry) -> None:
        if self._readonly:
            return
        try:
            store.put(entry.key, encode(entry, secret=self.config.secret))
        except Exception as exc:
            self._error("write", f"cannot write the cache ({exc}); continuing uncached"
                        f"{self._where()}")
            return
        self.record(STORES, entry.key)

    def _remember_name(self, store: Store, key: CacheKey, graph_name: str) -> None:
        # A miss report's hint (miss_reasons.py), imported where an entry is
        # made: a warm process never does.
        if not self._readonly:
            from .miss_reasons import remember_name

            remember_name(store, key, graph_name)

    def _where(self) -> str:
        """Which settings name the cache a warning is about."""
        remote = ", over LTC_CACHE_REMOTE" if self.config.remote else ""
        return f" (the cache: LTC_CACHE_DIR={self.config.directory}{remote})"

    def _error(self, topic: str, message: str) -> None:
        self.record(ERRORS)
        warn_once(topic, message)
        return None
