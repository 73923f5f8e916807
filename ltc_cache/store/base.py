"""The interface every tier implements: bytes in, bytes out, by key; and
the simplest tier, a dict (MemoryStore)."""

from __future__ import annotations

import abc
import contextlib
import re
from collections.abc import Iterator
from contextlib import AbstractContextManager

__all__ = ["MAX_ENTRY_BYTES", "MemoryStore", "Store", "is_entry_key"]

# No entry is decoded, and no stored value read, past this many bytes; no
# entry ltc_cache writes comes near it.
MAX_ENTRY_BYTES = 1 << 30

# Entry keys are hex sha256 digests (ltc_cache/entries/keys.py); any other
# key is an internal record (ltc_cache/entries/wire.py).
_ENTRY_KEY = re.compile(r"[0-9a-f]{64}")


def is_entry_key(key: object) -> bool:
    """Whether ``key`` names an entry rather than an internal record."""
    return isinstance(key, str) and len(key) == 64 and _ENTRY_KEY.fullmatch(key) is not None


class Store(abc.ABC):
    """A mapping of key strings to entry bytes.

    ``get`` returns None for a missing key; stores raise OSError (or a
    subclass) when the medium fails, and the cache turns that into a warning.
    """

    @abc.abstractmethod
    def get(self, key: str) -> bytes | None: ...

    @abc.abstractmethod
    def put(self, key: str, value: bytes) -> None: ...

    @abc.abstractmethod
    def delete(self, key: str) -> bool:
        """Remove ``key``; True if it was there."""

    @abc.abstractmethod
    def keys(self) -> Iterator[str]: ...

    def lock(self, key: str, timeout: float) -> AbstractContextManager[object]:
        """Hold ``key`` against other processes that would write it; tiers
        without cross-process locking hold nothing. Raises LockTimeout."""
        return contextlib.nullcontext()

    def record(self, event: str, key: str | None) -> None:  # noqa: B027 - optional hook
        """Note a cache event (hit, miss, trace, store, error) of ``key`` for
        counters that outlive the process; tiers without them ignore it.
        Must be cheap and must not raise."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release files or connections."""


class MemoryStore(Store):
    """A store in a dict: for tests and for a per-process tier."""

    def __init__(self) -> None:
        self._data: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        return self._data.get(key)

    def put(self, key: str, value: bytes) -> None:
        self._data[key] = bytes(value)

    def delete(self, key: str) -> bool:
        return self._data.pop(key, None) is not None

    def keys(self) -> Iterator[str]:
        return iter(list(self._data))
