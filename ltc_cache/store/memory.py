"""A store in a dict: for tests and for a per-process tier."""

from __future__ import annotations

from collections.abc import Iterator

from .base import Store

__all__ = ["MemoryStore"]


class MemoryStore(Store):
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
