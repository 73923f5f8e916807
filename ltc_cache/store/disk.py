"""The local disk tier: diskcache for the entries, filelock for single flight.

Layout of a cache directory::

    entries/   diskcache (SQLite index + files for large values)
    locks/     one lock file per key being traced
    ledger.db  counters across processes, and listing summaries (ledger.py)
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import diskcache

from ..counter_names import ERRORS, EVICTIONS
from ..diagnostics import count_event, warn_once
from ..errors import EntryError, LockTimeout, UnsafeDirectory, WrongType
from .base import MAX_ENTRY_BYTES, Store, is_entry_key
from .ledger import LEDGER_NAME, Ledger
from .safety import (
    check_private_dir,
    directory_id,
    is_corruption,
    read_value_file,
    replace_index,
    value_file_problem,
)

if TYPE_CHECKING:
    import filelock

__all__ = ["DiskStore", "StoredRow"]

logger = logging.getLogger("ltc_cache.store.disk")

# diskcache's own default is 1 GB; without LTC_CACHE_MAX_SIZE nothing is evicted.
_NO_LIMIT = 2**62
# Bytes of a stored value: diskcache's ``size`` column is 0 for values kept
# inside its database, so those are measured (SQLite reads a blob's length
# without reading the blob).
_VALUE_BYTES = "CASE WHEN filename IS NULL THEN length(value) ELSE size END"


# SQL for ledger.is_entry_key: 64 lower-case hex digits.
_ENTRY_KEY_SQL = "length(key) = 64 AND key NOT GLOB '*[^0-9a-f]*'"


class BytesOnlyDisk(diskcache.Disk):
    """diskcache's serializer, narrowed to bytes: it never pickles on the
    way in, and refuses to unpickle a value that was stored pickled (by
    another program writing into the directory) on the way out."""

    def __init__(self, directory, **kwargs) -> None:
        super().__init__(directory, **kwargs)
        self._written = threading.local()

    def store(self, value, read, key=diskcache.core.UNKNOWN):
        if not isinstance(value, bytes) or read:
            raise WrongType("ltc_cache stores bytes only")
        result = super().store(value, read, key=key)
        self._written.filename = result[2]
        return result

    def take_written(self) -> str | None:
        """The value file the last ``store`` of this thread wrote: if its row
        never commits (disk full, killed transaction), nothing refers to it."""
        filename, self._written.filename = getattr(self._written, "filename", None), None
        return filename

    def _write(self, full_path, iterator, mode, encoding=None):
        try:
            return super()._write(full_path, iterator, mode, encoding)
        except BaseException as exc:
            # A value cut short by a full disk would stay behind, unreferenced,
            # taking the space the disk lacks.
            if not isinstance(exc, FileExistsError):
                with contextlib.suppress(OSError):
                    os.remove(full_path)
            raise

    def remove(self, file_path):
        # diskcache removes the file an index row names when the row is
        # replaced or evicted; a planted row must not make it delete a file
        # outside the directory (``../``) or through a symlinked level.
        problem = value_file_problem(self._directory, file_path)
        if problem is None:
            super().remove(file_path)
        else:
            logger.warning("not removing %r (in LTC_CACHE_DIR): %s", file_path, problem)

    def get(self, key, raw):
        # A key that is not raw was pickled by another program: never unpickled,
        # so ``keys()`` skips it.
        return super().get(key, raw) if raw else None

    def fetch(self, mode, filename, value, read):
        if read or mode not in (diskcache.core.MODE_BINARY, diskcache.core.MODE_RAW):
            raise EntryError(f"value stored in diskcache mode {mode}, not bytes; refused")
        if mode == diskcache.core.MODE_RAW:
            data = super().fetch(mode, filename, value, read)
            if not isinstance(data, bytes):
                raise EntryError(f"value stored as {type(data).__name__}, not bytes; refused")
            return data
        # Not diskcache's plain open(): that follows symlinks and reads any size.
        return read_value_file(self._directory, filename, MAX_ENTRY_BYTES)


class DiskStore(Store):
    """Entries in ``directory``; see the module docstring for its layout.

    A directory another user could write into is refused (UnsafeDirectory,
    a PermissionError): its entries are code this process would run.
    ReadOnlyDiskStore (store/readonly.py) serves the entries of an existing
    directory and writes nothing to it, not even access times or lock files;
    ``open_directory(readonly=...)`` (store/tiers.py) chooses between them.
    A damaged SQLite index is replaced by an empty one; reads that find it
    damaged raise EntryError, which the cache treats as a miss.
    """

    readonly = False

    def __init__(self, directory: Path, *, max_size: int | None = None) -> None:
        self.directory = Path(directory)
        self._locks = self.directory / "locks"
        self._entries = self.directory / "entries"
        self._max_size = max_size
        self._limit_noted = False
        self._swap = threading.Lock()
        check_private_dir(self.directory, create=True)
        for sub in (self._entries, self._locks):
            check_private_dir(sub, create=True, nested=True)
        self._refuse_linked_index()
        try:
            self.cache = self._open()
        except Exception as exc:
            if not is_corruption(exc):
                raise
            replace_index(self._entries, self._locks, directory_id(self._entries))
            warn_once("corrupt-index", f"the cache index in {self._entries} was damaged "
                      f"({type(exc).__name__}: {exc}); replaced it with an empty one "
                      "(the cache directory is LTC_CACHE_DIR)")
            self._reopen()
            count_event(ERRORS, self)

    def _refuse_linked_index(self) -> None:
        db = self._entries / "cache.db"
        if db.is_symlink():
            raise UnsafeDirectory(f"{db} is a symlink; ltc_cache refuses to follow it")

    def _open(self) -> diskcache.Cache:
        self._opened = directory_id(self._entries)
        return diskcache.Cache(
            str(self._entries),
            disk=BytesOnlyDisk,
            eviction_policy="least-recently-used",
            size_limit=self._max_size or _NO_LIMIT,
            # diskcache culls ten entries at once (the one just stored among
            # them when they are large); _evict_over_limit evicts exactly.
            cull_limit=0,
            # No fsync: SQLite's syncs (a new WAL file's header and its
            # directory at every open, a checkpoint at close) cost a warm
            # start ~60 ms of waiting on the disk, longer than the rest of
            # it. A killed process loses nothing without them (the kernel
            # holds the writes); a power loss can damage the index, which
            # is then detected and replaced (docs/reliability.md).
            sqlite_synchronous=0,
        )

    def _reopen(self) -> None:
        """Open the index anew: after it was replaced, here or elsewhere."""
        check_private_dir(self._entries, create=True, nested=True)
        self.cache = self._open()

    def _current(self) -> diskcache.Cache:
        # Another process may have replaced a damaged index (or `ltc-cache
        # clear` removed it): a connection to the old one would go on using
        # a deleted database.
        if directory_id(self._entries) != self._opened:
            with self._swap:
                if directory_id(self._entries) != self._opened:
                    self.cache.close()
                    self._reopen()
        return self.cache

    def _guarded(self, op, *args):
        """``op(cache, *args)``; a damaged index is replaced, and the call
        raises EntryError (the cache's word for a miss it should warn of)."""
        cache = self._current()
        try:
            return op(cache, *args)
        except Exception as exc:
            if not is_corruption(exc):
                raise
            with self._swap:
                if cache is self.cache:
                    cache.close()
                    replace_index(self._entries, self._locks, self._opened)
                    self._reopen()
            raise EntryError(f"the cache index was damaged ({type(exc).__name__}: {exc}); "
                             "replaced it with an empty one") from None

    def get(self, key: str) -> bytes | None:
        return self._guarded(self._get, key)

    def _get(self, cache: diskcache.Cache, key: str) -> bytes | None:
        try:
            # No retry: diskcache retries a failing BEGIN without limit,
            # whatever the error. SQLite already waits out other writers
            # (diskcache's 60 s busy timeout).
            return cache.get(key, default=None, retry=False)
        except Exception as exc:
            if not isinstance(exc, (diskcache.Timeout, sqlite3.OperationalError)) \
                    or is_corruption(exc):
                raise
        # The least-recently-used policy writes the access time on every get;
        # where that write cannot happen (disk full, database turned read-only,
        # a writer holding it past the timeout) the value can still be read.
        return self.peek(key)

    def put(self, key: str, value: bytes) -> None:
        value = bytes(value)
        try:
            self._guarded(self._set, key, value)
        except EntryError:  # the index was damaged and is new now: store there
            self._guarded(self._set, key, value)
        self._after_put(key, value)

    @staticmethod
    def _set(cache: diskcache.Cache, key: str, value: bytes) -> None:
        disk = cache.disk
        disk.take_written()
        try:
            cache.set(key, value, retry=False)
        except BaseException:
            # diskcache writes a large value's file before its row; a row that
            # never commits leaves the file to nobody.
            filename = disk.take_written()
            if filename is not None:
                disk.remove(filename)
            raise
        disk.take_written()

    def delete(self, key: str) -> bool:
        return self._guarded(lambda cache, k: cache.delete(k, retry=False), key)

    def keys(self) -> Iterator[str]:
        # Keys another program pickled come back as None (BytesOnlyDisk.get).
        return (k for k in self._current().iterkeys() if isinstance(k, str))

    @contextlib.contextmanager
    def lock(self, key: str, timeout: float) -> Iterator[filelock.BaseFileLock]:
        # Imported here: a process that only reads (a warm start) never
        # locks, and filelock's ~20 modules cost ~0.5 MiB (BENCHMARKS.md).
        import filelock

        lock = filelock.FileLock(str(self._locks / f"{key}.lock"), timeout=timeout)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise LockTimeout(key, timeout) from None
        try:
            yield lock
        finally:
            lock.release()

    def close(self) -> None:
        self.cache.close()
        self._close_ledger()

    def _close_ledger(self) -> None:
        if "ledger" in self.__dict__:  # opened
            self.ledger.close()

    def __repr__(self) -> str:
        readonly = ", readonly=True" if self.readonly else ""
        return f"DiskStore({os.fspath(self.directory)!r}{readonly})"

    # -- for ltc-cache: persisted counters, listing, an exact LRU size limit --

    @functools.cached_property
    def ledger(self) -> Ledger:
        """This directory's counters and listing summaries."""
        return Ledger(self.directory / LEDGER_NAME)

    def record(self, event: str, key: str | None) -> None:
        self.ledger.record(event, key)  # one small transaction; never raises

    def _query(self, sql: str, params: tuple = ()) -> list[tuple]:
        """A query that reads diskcache's index table (``Cache``), through
        diskcache's own connection: its private ``_sql``, and its table
        layout, which is why pyproject pins the diskcache versions tested
        (tests/store/test_diskcache_layout.py fails when either changes)."""
        return self._guarded(lambda cache: cache._sql(sql, params).fetchall())

    def _value_disk(self) -> BytesOnlyDisk:
        """What reads a value file this store's index names."""
        return self._current().disk

    def rows(self) -> list[StoredRow]:
        """Every stored value from diskcache's index, without reading values."""
        return [StoredRow(*row) for row in self._query(
            f"SELECT key, {_VALUE_BYTES}, store_time, access_time FROM Cache WHERE raw = 1")]

    def peek(self, key: str) -> bytes | None:
        """``get`` that leaves the entry's last use alone: verifying or
        exporting a cache must not make every entry look recently used."""
        rows = self._query("SELECT mode, filename, value FROM Cache WHERE key = ? AND raw = 1",
                           (key,))
        if not rows:
            return None
        return self._value_disk().fetch(*rows[0], False)

    def discard(self, keys: Iterable[str]) -> list[str]:
        """Delete ``keys`` and their ledger records; returns those that were there."""
        removed = [key for key in keys if self.delete(key)]
        self.ledger.forget(removed)
        return removed

    def _after_put(self, key: str, value: bytes) -> None:
        self.ledger.note_put(key, value)  # never raises
        if not self._limit_noted:  # once per store: the limit this process keeps
            self._limit_noted = True
            self.ledger.note_limit(self._max_size or None)
        try:
            self._evict_over_limit(keep=key)
        except Exception as exc:  # the entry is stored; the limit holds at the next put
            logger.debug("cannot evict in %s: %s", self.directory, exc)

    def _evict_over_limit(self, keep: str) -> list[str]:
        """Delete least recently used entries until the stored bytes fit the
        size limit. ``keep`` (just stored) and internal records stay."""
        limit = self._max_size
        if not limit:
            return []
        # The limit is on entries: internal records are never evicted, so
        # counting them would evict entries for bytes that cannot be freed.
        (total,), = self._query(f"SELECT COALESCE(SUM({_VALUE_BYTES}), 0) FROM Cache "
                                f"WHERE raw = 1 AND {_ENTRY_KEY_SQL}")
        if total <= limit:
            return []
        evicted = []
        for key, size in self._query(f"SELECT key, {_VALUE_BYTES} FROM Cache WHERE raw = 1 "
                                     "ORDER BY access_time"):
            if total <= limit:
                break
            if key != keep and is_entry_key(key) and self.delete(key):
                total -= size
                evicted.append(key)
        logger.info("evicted %d least recently used entries to stay under %d bytes",
                    len(evicted), limit)
        self.ledger.add(EVICTIONS, len(evicted))
        with contextlib.suppress(Exception):
            self.ledger.forget(evicted)
        return evicted


class StoredRow(NamedTuple):
    key: str
    size: int  # bytes of the stored value
    stored: float  # when it was written (time.time())
    accessed: float  # when a get last read it, or ``stored``
