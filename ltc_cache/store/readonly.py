"""Reading a cache directory without writing a byte to it.

``diskcache.Cache`` cannot serve a read-only directory: opening one writes
its settings, and with the least-recently-used policy every ``get``
updates the entry's access time. ``LTC_CACHE_READONLY`` (and a cache on a
read-only mount) instead reads diskcache's index table directly through a
read-only SQLite connection (:class:`ReadOnlyIndex`), and the store over it
(:class:`ReadOnlyDiskStore`) refuses writes, takes no locks and records no
counters.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ..errors import NoCache, ReadOnlyStore
from .disk import BytesOnlyDisk, DiskStore
from .safety import check_private_dir

__all__ = ["ReadOnlyDiskStore", "ReadOnlyIndex"]

# diskcache's database file inside its directory (diskcache.core.DBNAME).
_DBNAME = "cache.db"


class ReadOnlyIndex:
    """Rows of a diskcache index, read without writing.

    diskcache runs SQLite in WAL mode, whose readers normally create and
    write the ``-shm`` index file. When no ``-wal`` file exists every write
    is in the main file, and ``immutable=1`` reads it without creating a
    file or taking a lock (a read-only mount has no room for either). When
    one exists, a writer may be active and ``mode=ro`` shares its WAL.
    """

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory).resolve() / _DBNAME
        if not self.path.is_file():
            raise NoCache(f"no cache index at {self.path}")
        self._lock = threading.Lock()
        self._pid = -1
        self._con: sqlite3.Connection | None = None

    def _connect(self) -> sqlite3.Connection:
        if self._con is not None and self._pid == os.getpid():
            return self._con
        uri = self.path.as_uri()
        con = None
        if os.path.exists(f"{self.path}-wal"):
            try:
                con = sqlite3.connect(f"{uri}?mode=ro", uri=True, check_same_thread=False)
                con.execute("SELECT 1 FROM Cache LIMIT 1").fetchall()
            except sqlite3.OperationalError:  # no -shm and no room to make one
                con = None
        if con is None:
            con = sqlite3.connect(f"{uri}?immutable=1", uri=True, check_same_thread=False)
        self._con, self._pid = con, os.getpid()
        return con

    def query(self, sql: str, params: tuple = ()) -> list[tuple]:
        """The rows of a query on the index."""
        with self._lock:
            return self._connect().execute(sql, params).fetchall()

    def fetch(self, key: str, load: Callable[[int, str | None, object], bytes]) -> bytes | None:
        """The value of ``key`` (``load(mode, filename, value)`` reads it),
        None if absent or expired."""
        rows = self.query("SELECT mode, filename, value FROM Cache WHERE key = ? AND raw = 1"
                          " AND (expire_time IS NULL OR expire_time > ?)", (key, time.time()))
        if not rows:
            return None
        try:
            return load(*rows[0])
        except FileNotFoundError:  # removed by a writer since the row was read
            return None

    def keys(self) -> Iterator[str]:
        rows = self.query("SELECT key FROM Cache WHERE raw = 1 ORDER BY rowid")
        return (key for (key,) in rows if isinstance(key, str))

    def close(self) -> None:
        with self._lock:
            if self._con is not None and self._pid == os.getpid():
                self._con.close()
            self._con = None


class ReadOnlyDiskStore(DiskStore):
    """The entries of an existing cache directory, served without writing to
    it: not even access times, lock files or counters.
    ``open_directory(directory, readonly=True)`` makes one.

    The directory may belong to root (a cache baked into an image), unlike a
    writable one. ``put`` and ``delete`` raise PermissionError; ``lock``
    holds nothing, since nothing is traced into this directory.
    """

    readonly = True

    def __init__(self, directory: Path, *, max_size: int | None = None) -> None:
        self.directory = Path(directory)
        self._entries = self.directory / "entries"
        self._max_size = max_size
        check_private_dir(self.directory, create=False, allow_root=True)
        check_private_dir(self._entries, create=False, allow_root=True, nested=True)
        self._refuse_linked_index()
        self._disk = BytesOnlyDisk(str(self._entries))
        self._index = ReadOnlyIndex(self._entries)

    def get(self, key: str) -> bytes | None:
        return self._index.fetch(
            key, lambda mode, filename, value: self._disk.fetch(mode, filename, value, False))

    def put(self, key: str, value: bytes) -> None:
        raise ReadOnlyStore(f"{self} is read-only")

    def delete(self, key: str) -> bool:
        raise ReadOnlyStore(f"{self} is read-only")

    def keys(self) -> Iterator[str]:
        return self._index.keys()

    def lock(self, key: str, timeout: float) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def record(self, event: str, key: str | None) -> None:
        """Nothing: a read-only directory is not written, counters included."""

    def close(self) -> None:
        self._index.close()
        self._close_ledger()

    def _query(self, sql: str, params: tuple = ()) -> list[tuple]:
        return self._index.query(sql, params)

    def _value_disk(self) -> BytesOnlyDisk:
        return self._disk
