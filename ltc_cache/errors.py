"""Errors the cache raises; each subclasses :class:`LtcCacheError` and the
builtin it refines."""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["AmbiguousKey", "BadArgument", "BundleError", "CompileTimeout", "EntryError",
           "FuseFailed", "GraphNotExtractable", "GrowingLayout", "KindNotRegistered",
           "LayoutChanged", "LockTimeout", "LtcCacheError", "LtcUnavailable",
           "MissingDependency", "NoCache", "NoLibrary", "NoSuchEntry",
           "NotACacheDirectory", "NotForThisCpu", "PlanError", "ReadOnlyStore",
           "RememberedFailure", "RewriteRefused", "StoreTimeout", "StoreUnreachable",
           "UncacheableGraph", "UnexpectedPackage", "UnpickledForward", "Unrepeatable",
           "Unreplaceable", "UnsafeDirectory", "UnsafeProgramKey", "Unspecializable",
           "UsageError", "WrongType", "first_line", "is_graph_failure",
           "is_graph_failure_reason"]


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


# Messages of RuntimeErrors that come from the process, not the graph, where
# torch gives them no type of their own: other resources, and LTC's backend
# initialised twice (what entries stored before that was tolerated say). Out
# of memory has a type (torch.OutOfMemoryError, a RuntimeError) and is told
# by it; its message is here for the reasons negative entries stored, which
# are text.
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
    torch = sys.modules.get("torch")  # loaded wherever a trace failed
    if torch is not None and isinstance(exc, torch.OutOfMemoryError):
        return False
    # What LTC's lowering raises is a plain RuntimeError (torch gives it no
    # type of its own), as are the resource failures above: told by message.
    return is_graph_failure_reason(str(exc))


def is_graph_failure_reason(reason: str) -> bool:
    """Whether ``reason``, the message of a failure a negative entry stored,
    is about the graph rather than the process that stored it."""
    message = reason.lower()
    return not any(text in message for text in _PROCESS_MESSAGES)


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first non-blank line of ``exc``'s message (LTC's and Dynamo's run
    to pages), at most ``limit`` characters; its type where it has none."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0][:limit] if lines else type(exc).__name__


class Unportable(LtcCacheError, ValueError):
    """A program that cannot be stored safely (a guard this module cannot
    check in another process, a function without a source file)."""


class AmbiguousKey(LtcCacheError, ValueError):
    def __init__(self, prefix: str, candidates: Sequence[str]) -> None:
        super().__init__(f"{prefix!r} matches {len(candidates)} entries: "
                         f"{', '.join(c[:12] for c in candidates[:5])}"
                         f"{' …' if len(candidates) > 5 else ''}")
        self.candidates = tuple(candidates)



class BundleError(LtcCacheError, ValueError):
    """A file that is not a bundle, or a damaged one."""



class CompileTimeout(BaseException):
    """The compile ran past its limit. A BaseException, so that a build's
    ``except Exception`` (which refuses whatever the compile raises) lets
    it through to the caller, which refuses it by name."""



class FuseFailed(LtcCacheError, RuntimeError):
    """A graph that cannot be given a library; its message is the reason stored."""



class GrowingLayout(LtcCacheError):
    """An argument whose layout changes on every call (a dynamic key/value
    cache): a program per call would be a capture per decoding step."""



class NoCache(LtcCacheError, FileNotFoundError):
    """The directory is missing or is not a cache directory."""



class NoLibrary(LtcCacheError):
    """Why a plan's graph gets no library, known before compiling it."""



class PlanError(LtcCacheError, ValueError):
    """A graph that cannot be stored as a plan (a node or value of a kind a
    plan does not hold)."""



class UnexpectedPackage(LtcCacheError, RuntimeError):
    """AOTInductor's package holds something other than one library."""



class Unrepeatable(LtcCacheError):
    """A recomputed op that draws: its plan keeps its regions."""



class UnsafeDirectory(LtcCacheError, PermissionError):
    """A cache directory that another user could write into."""



class Unspecializable(LtcCacheError, ValueError):
    """A graph whose scalar values cannot all be made concrete (a value that
    depends on tensor data, such as an unbacked size)."""



class UsageError(LtcCacheError):
    """Bad input on the command line: exit status 2."""


class BadArgument(LtcCacheError, ValueError):
    """A value ltc_cache does not take: of a setting (an environment
    variable), a command-line argument, a backend option, an argument of
    the API; the message says what it takes."""


class WrongType(LtcCacheError, TypeError):
    """A value of a type ltc_cache cannot take: an argument of the API, or
    a stored or traced value that is not the kind it must be."""


class NoSuchEntry(LtcCacheError, KeyError):
    """No entry has the key (or key prefix) asked for."""


class KindNotRegistered(LtcCacheError, KeyError):
    """An entry kind whose product has not registered it."""


class ReadOnlyStore(LtcCacheError, PermissionError):
    """A write to a cache opened read-only."""


class UnsafeProgramKey(LtcCacheError, PermissionError):
    """A program key file others could read or write, or one that is too
    short, or inside the cache directory."""


class StoreTimeout(LtcCacheError, TimeoutError):
    """A shared tier that did not answer in time."""


class MissingDependency(LtcCacheError, ImportError):
    """A feature whose optional dependency is not installed."""


class RewriteRefused(LtcCacheError, ValueError):
    """A traced graph the rewrites cannot take as it is: stored as traced."""


class LayoutChanged(LtcCacheError, RuntimeError):
    """An output laid out otherwise than when its graph was traced."""


class UnpickledForward(LtcCacheError, RuntimeError):
    """A forward that ran through ltc_cache programs, called after
    unpickling: it must be compiled again."""


class Unreplaceable(LtcCacheError, AttributeError):
    """The module of a compiled stand-in, which cannot be replaced."""


class StoreUnreachable(LtcCacheError, ConnectionError):
    """A shared tier that failed to answer (refused, reset, gone)."""


class NotACacheDirectory(LtcCacheError, NotADirectoryError):
    """The cache directory's path names something that is not a directory."""
