"""Reading a diskcache directory without writing a byte to it.

``diskcache.Cache`` cannot serve a read-only directory: opening one writes
its settings, and with the least-recently-used policy every ``get``
updates the entry's access time. ``LTC_CACHE_READONLY`` (and a cache on a
read-only mount) instead reads diskcache's index table directly through a
read-only SQLite connection.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["ReadOnlyIndex"]

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
            raise FileNotFoundError(f"no cache index at {self.path}")
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

    def fetch(self, key: str, load: Callable[[int, str | None, object], bytes]) -> bytes | None:
        """The value of ``key`` (``load(mode, filename, value)`` reads it),
        None if absent or expired."""
        with self._lock:
            row = self._connect().execute(
                "SELECT mode, filename, value FROM Cache WHERE key = ? AND raw = 1"
                " AND (expire_time IS NULL OR expire_time > ?)", (key, time.time())).fetchone()
        if row is None:
            return None
        try:
            return load(*row)
        except FileNotFoundError:  # removed by a writer since the row was read
            return None

    def keys(self) -> Iterator[str]:
        with self._lock:
            rows = self._connect().execute(
                "SELECT key FROM Cache WHERE raw = 1 ORDER BY rowid").fetchall()
        return (key for (key,) in rows if isinstance(key, str))

    def close(self) -> None:
        with self._lock:
            if self._con is not None and self._pid == os.getpid():
                self._con.close()
            self._con = None
