"""Errors the cache raises; each subclasses the builtin it refines."""

from __future__ import annotations

__all__ = ["EntryError", "LockTimeout", "UncacheableGraph"]


class EntryError(ValueError):
    """Stored bytes are not a usable entry: corrupt, truncated, of another
    schema, or unsigned/tampered where signing is on. The cache treats it as
    a miss and replaces the entry."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message if key is None else f"entry {key[:12]}: {message}")
        self.key = key


class LockTimeout(TimeoutError):
    """Another process held a key's lock for longer than the lock timeout."""

    def __init__(self, key: str, timeout: float) -> None:
        super().__init__(f"waited {timeout:g}s for the lock of entry {key[:12]}")
        self.key = key
        self.timeout = timeout


class UncacheableGraph(TypeError):
    """The call cannot be keyed (an argument of a type with no stable
    identity), so it is traced without the cache."""
