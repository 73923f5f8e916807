"""The local disk tier: diskcache for the entries, filelock for single flight.

Layout of a cache directory::

    entries/   diskcache (SQLite index + files for large values)
    locks/     one lock file per key being traced
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import diskcache
import filelock

from ..errors import EntryError, LockTimeout
from .base import Store

__all__ = ["DiskStore", "ensure_private_dir"]

# diskcache's own default is 1 GB; without LTC_CACHE_MAX_SIZE nothing is evicted.
_NO_LIMIT = 2**62


class BytesOnlyDisk(diskcache.Disk):
    """diskcache's serializer, narrowed to bytes: it never pickles on the
    way in, and refuses to unpickle a value that was stored pickled (by
    another program writing into the directory) on the way out."""

    def store(self, value, read, key=diskcache.core.UNKNOWN):
        if not isinstance(value, bytes) or read:
            raise TypeError("ltc_cache stores bytes only")
        return super().store(value, read, key=key)

    def fetch(self, mode, filename, value, read):
        if mode not in (diskcache.core.MODE_BINARY, diskcache.core.MODE_RAW):
            raise EntryError(f"value stored in diskcache mode {mode}, not bytes; refused")
        return super().fetch(mode, filename, value, read)


def ensure_private_dir(path: Path) -> None:
    """Create ``path`` (and parents) readable by the owner only."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)


class DiskStore(Store):
    def __init__(self, directory: Path, *, max_size: int | None = None) -> None:
        self.directory = Path(directory)
        ensure_private_dir(self.directory)
        self._locks = self.directory / "locks"
        self._locks.mkdir(mode=0o700, exist_ok=True)
        self.cache = diskcache.Cache(
            str(self.directory / "entries"),
            disk=BytesOnlyDisk,
            eviction_policy="least-recently-used",
            size_limit=max_size or _NO_LIMIT,
        )

    def get(self, key: str) -> bytes | None:
        return self.cache.get(key, default=None, retry=True)

    def put(self, key: str, value: bytes) -> None:
        self.cache.set(key, bytes(value), retry=True)

    def delete(self, key: str) -> bool:
        return self.cache.delete(key, retry=True)

    def keys(self) -> Iterator[str]:
        return iter(self.cache.iterkeys())

    @contextlib.contextmanager
    def lock(self, key: str, timeout: float) -> Iterator[filelock.BaseFileLock]:
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

    def __repr__(self) -> str:
        return f"DiskStore({os.fspath(self.directory)!r})"
