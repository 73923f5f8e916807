"""The Redis tier as ``ltc-cache`` sees it: the same listing, statistics,
deletion plans and verification as a cache directory.

RemoteTier gives a RedisStore the few methods the reports use on a
DiskStore (``rows``, ``peek``, ``discard``, a ``ledger``). Redis keeps no
counters and no listing summaries: each entry's summary is read from its
bytes (no torch), sizes and idle times come from Redis in one round trip,
and no TTL is renewed by looking.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from ..store.disk import StoredRow
from ..store.redis import RedisStore

__all__ = ["RemoteTier"]


class _NoLedger:
    """What a ledger answers where there is none: nothing recorded."""

    def entries(self) -> dict[str, Any]:
        return {}

    def counters(self) -> dict[str, int]:
        return {}

    def zeroed_at(self) -> float | None:
        return None

    def size_limit(self) -> tuple[bool, int | None]:
        return False, None

    def forget(self, keys: Iterable[str]) -> None:
        pass


class RemoteTier:
    """A RedisStore, shaped for the reports."""

    readonly = False
    ledger = _NoLedger()

    def __init__(self, url: str) -> None:
        self.store = RedisStore(url)
        self.directory = f"redis {self.store.where()}"

    def rows(self) -> list[StoredRow]:
        keys = list(self.store.keys())
        now = time.time()
        rows = []
        for key, (size, idle) in zip(keys, self.store.sizes_and_idle(keys), strict=True):
            # Redis keeps no write time; the entry's own "created" is used for
            # display, and without idle times (an LFU policy) "last used" is unknown.
            last_read = now - idle if idle is not None else 0.0
            rows.append(StoredRow(key, size, last_read, last_read))
        return rows

    def peek(self, key: str) -> bytes | None:
        return self.store.peek(key)

    def discard(self, keys: Iterable[str]) -> list[str]:
        return self.store.discard(list(keys))

    def delete(self, key: str) -> bool:
        return self.store.delete(key)

    def close(self) -> None:
        self.store.close()
