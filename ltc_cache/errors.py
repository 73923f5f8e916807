"""Errors the cache raises; each subclasses :class:`LtcCacheError` and the
builtin it refines."""

from __future__ import annotations

__all__ = ["EntryError", "GraphNotExtractable", "LockTimeout", "LtcCacheError", "LtcUnavailable",
           "NotForThisCpu", "RememberedFailure", "UncacheableGraph", "first_line",
           "is_graph_failure"]


class LtcCacheError(Exception):
    """The base of every exception ltc_cache defines, so that
    ``except ltc_cache.LtcCacheError`` catches them all. Each also
    subclasses the builtin it refines (:class:`EntryError` is a
    ``ValueError``, :class:`LockTimeout` a ``TimeoutError``), so that
    ``except ValueError`` and the like catch what they always have."""


class EntryError(LtcCacheError, ValueError):
    """Stored bytes are not a usable entry: corrupt, truncated, of another
    schema, or unsigned/tampered where signing is on. The cache treats it as
    a miss and replaces the entry."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message if key is None else f"entry {key[:12]}: {message}")
        self.key = key


class NotForThisCpu(EntryError):
    """A fused library needs vector instructions this CPU lacks (or that
    ltc_cache does not know): a miss here, kept for the CPUs it was built
    for, never loaded and never replaced."""


class LockTimeout(LtcCacheError, TimeoutError):
    """Another process held a key's lock for longer than the lock timeout."""

    def __init__(self, key: str, timeout: float) -> None:
        super().__init__(f"waited {timeout:g}s for the lock of entry {key[:12]}")
        self.key = key
        self.timeout = timeout


class UncacheableGraph(LtcCacheError, TypeError):
    """The call cannot be keyed (an argument of a type with no stable
    identity), so it is traced without the cache."""


class LtcUnavailable(LtcCacheError, RuntimeError):
    """LTC cannot run in this process (its backend failed to initialise):
    a fact about the process, not the graph, so never remembered."""


class GraphNotExtractable(LtcCacheError, RuntimeError):
    """LTC traced the graph but it cannot become an entry: an op LTC fell
    back on, an input or output of a kind no entry can hold. A fact about
    the graph, the same in every process, so a negative entry remembers it."""


class RememberedFailure(GraphNotExtractable):
    """A negative entry's hit: the graph failed in an earlier process, for
    the reason it remembers; the caller partitions it or runs it eagerly
    without tracing again."""


# Messages of RuntimeErrors that come from the process, not the graph: out
# of memory (torch.OutOfMemoryError is a RuntimeError too), other resources,
# and LTC's backend initialised twice (what entries stored before that was
# tolerated say).
_PROCESS_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory",
                     "resource temporarily unavailable", "too many open files",
                     "register multiple backend fallbacks", "backend not registered")


def is_graph_failure(exc: BaseException) -> bool:
    """Whether a failed trace says something about the graph itself (an op
    LTC cannot lower, a fallback), so that every process would fail the same
    way and a negative entry may remember it. Environment, import, resource
    and lock failures are not: the next process may well succeed."""
    if isinstance(exc, GraphNotExtractable):
        return True
    if not isinstance(exc, RuntimeError) or isinstance(exc, LtcUnavailable):
        return False
    # What LTC's lowering raises is a plain RuntimeError (torch gives it no
    # type of its own), as are torch's resource failures: told by message.
    if type(exc).__name__ == "OutOfMemoryError":
        return False
    message = str(exc).lower()
    return not any(text in message for text in _PROCESS_MESSAGES)


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first non-blank line of ``exc``'s message (LTC's and Dynamo's run
    to pages), at most ``limit`` characters; its type where it has none."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0][:limit] if lines else type(exc).__name__


class Unportable(LtcCacheError, ValueError):
    """A program that cannot be stored safely (a guard this module cannot
    check in another process, a function without a source file)."""
