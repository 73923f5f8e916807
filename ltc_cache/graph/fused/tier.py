"""The fused tier in front of a graph's TorchScript function.

For each graph entry a process binds, :meth:`FusedTier.function` looks the
library up under :func:`~.platform.fused_key` of the entry's key and hands
back a :class:`~.runner.FusedFunction` where one is stored, verified and
loadable on this CPU, else the TorchScript function itself. Where none is
stored, what happens is ``LTC_CACHE_FUSE``'s:

- ``background`` (the default): the graph is queued and a worker compiles
  it out of band (:mod:`.queue`, :mod:`.worker`); the next process to load
  the graph uses the library. The calling process never waits for g++.
- ``sync``: compiled in the calling process before its first call (tests,
  and a build step that wants its libraries in one go).
- ``off``: no fused tier at all.

``ltc-cache fuse`` compiles stored graphs' libraries ahead, with
:func:`fuse_graph` as the worker does.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ...diagnostics import count_event, warn_once
from ...errors import EntryError
from ...signing import program_secret
from ..entry import Entry
from ..keys import CacheKey
from ..replay import GraphFunction
from .entries import DATA_DEPENDENT, NOT_FASTER, refusal_entry, usable_library
from .platform import fused_key
from .queue import FuseQueue, start_worker
from .runner import FusedFunction, load_runner, mismatch, runner_available

if TYPE_CHECKING:
    from ..cache import GraphCache

__all__ = ["FusedTier", "fuse_graph"]

logger = logging.getLogger("ltc_cache.fused")

_T = TypeVar("_T")

# This process's counts (ltc_cache.stats()).
LOADS, REFUSED, QUEUED = "fused_loads", "fused_refused", "fused_queued"


class FusedTier:
    """The fused libraries of one :class:`~ltc_cache.graph.cache.GraphCache`."""

    def __init__(self, cache: GraphCache) -> None:
        self._cache = cache
        self._lock = threading.Lock()
        self._functions: dict[str, GraphFunction] = {}
        self._worker_started = False

    def function(self, entry: Entry, script: GraphFunction | None) -> GraphFunction | None:
        """What replays ``entry``: its library where one is to be had,
        else ``script`` (its TorchScript function). Never raises."""
        config = self._cache.config
        if config.fuse == "off" or script is None or entry.kind != "graph" or not entry.key:
            return script
        with self._lock:  # one lookup and load per graph and process, whatever the threads
            if entry.key not in self._functions:
                try:
                    self._functions[entry.key] = self._obtain(entry, script)
                except Exception as exc:  # a store, a loader: never the user's failure
                    self._cache.record("errors")
                    warn_once("fused", f"fused library of {entry.graph_name}: {exc}; "
                              "replaying with TorchScript")
                    self._functions[entry.key] = script
            return self._functions[entry.key]

    def _obtain(self, entry: Entry, script: GraphFunction) -> GraphFunction:
        config = self._cache.config
        if not runner_available() or "input_specs" not in entry.meta:
            return script  # nothing to compile it for: an older entry, or not on the CPU
        key = fused_key(entry.key)
        stored = self._cache.lookup_entry(key, count=False)
        if stored is None and config.fuse == "sync" and not self._cache.readonly:
            stored = _in_a_clean_thread(fuse_graph, self._cache, entry.key, graph=entry)
        if stored is None:
            self._queue(entry)
            return script
        secret = program_secret(config.secret, config.directory)
        try:
            library = usable_library(stored, secret, entry.key)
        except EntryError as exc:
            self._cache.drop_entry(key, str(exc), remade="compiled")
            return script
        if library is None:  # refused: not faster, data-dependent (silently), or a failure
            reason = str(stored.payload.get("reason", ""))
            if not reason.startswith((NOT_FASTER, DATA_DEPENDENT)):
                warn_once("fused-refused", f"no fused library for {entry.graph_name} "
                          f"({entry.key[:12]}): {reason[:300]}; replaying with TorchScript "
                          "(`ltc-cache show` and `ltc-cache fuse --retry`)")
            return script
        runner = load_runner(library.data)
        count_event(LOADS)
        return FusedFunction(runner, script, aliases=library.aliases, restride=library.restride,
                             check=lambda expected, got, error: self._checked(
                                 entry, key, expected, got, error))

    def _checked(self, entry: Entry, key: CacheKey, expected: Sequence[Any],
                 got: Sequence[Any] | None, error: Exception | None) -> bool:
        """The verdict on a library's first call: refused for good where its
        outputs differ from TorchScript's (or it raised)."""
        problem = mismatch(expected, got, error=error)
        if problem is None:
            return True
        count_event(REFUSED)
        warn_once(f"fused:{key.digest}", f"the fused library of {entry.graph_name} "
                  f"({entry.key[:12]}) is not used: {problem}; replaying with TorchScript")
        self._cache.store_entry(refusal_entry(key, entry, f"on first use: {problem}"), key)
        return False

    def _queue(self, entry: Entry) -> None:
        config = self._cache.config
        if config.fuse != "background" or self._cache.readonly:
            return
        try:
            FuseQueue(config.directory).put(entry.key)
            count_event(QUEUED)
            if not self._worker_started:
                self._worker_started = True
                start_worker(config.directory)
        except (OSError, subprocess.SubprocessError) as exc:
            warn_once("fuse-worker", f"cannot queue graphs for fusing ({exc}); they replay "
                      "with TorchScript (`ltc-cache fuse` compiles them ahead)")


def fuse_graph(cache: GraphCache, graph_key: str, *, graph: Entry | None = None,
               retry: bool = False, timeout: float | None = None) -> Entry | None:
    """Compile and store the library of the graph stored under
    ``graph_key`` (``graph``: that entry, where the caller has it), unless
    its fused entry is stored already (``retry`` compiles a refused one
    again). Returns the fused entry, None where the graph is not stored.
    ``timeout``: seconds the compile may take (main thread only); past
    them it is refused."""
    from .build import build_entry

    key = fused_key(graph_key)
    stored = cache.lookup_entry(key, count=False)
    if stored is not None and (not retry or "library" in stored.payload):
        return stored
    if graph is None:
        graph = cache.lookup_entry(CacheKey(graph_key, {}), count=False)
        if graph is None or graph.kind != "graph":
            return None
    secret = program_secret(cache.config.secret, cache.config.directory)
    try:
        with _deadline(timeout):
            entry = build_entry(graph, key, secret)
    except _Timeout:
        entry = refusal_entry(key, graph, f"the compile took over {timeout:g} s "
                              "(LTC_CACHE_FUSE_TIMEOUT)")
    cache.store_entry(entry, key)
    return entry


def _in_a_clean_thread(fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``fn(*args, **kwargs)`` in a thread of its own: a graph's first call
    may come inside Dynamo's or AOTAutograd's tracing, whose fake mode and
    tracing context (thread-local, both) ``torch.export`` would pick up
    (fact 54 in docs/design.md)."""
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ltc_cache-fuse") as pool:
        return pool.submit(fn, *args, **kwargs).result()


class _Timeout(BaseException):  # past build_entry, which refuses on Exception
    pass


@contextlib.contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        raise _Timeout

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
