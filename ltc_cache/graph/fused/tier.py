"""The fused tier in front of a graph's TorchScript function.

For each graph entry a process binds, :meth:`FusedTier.function` looks the
library up under :func:`~.platform.fused_key` of the entry's
:func:`~.platform.source_key` (its content: identical layers share one
library, its verdict and its compile) and hands back a
:class:`~.runner.FusedFunction` where one is stored, verified and loadable
on this CPU (:mod:`.slot`), else the TorchScript function itself. Where
none is stored, what happens is ``LTC_CACHE_FUSE``'s:

- ``background`` (the default): the graph is queued and a worker compiles
  it out of band (:mod:`.queue`, :mod:`ltc_cache.cli.fuse_worker`); the graph replays with
  TorchScript meanwhile, and switches to the library once the worker has
  stored it (:mod:`.pickup`). The calling process never waits for g++.
- ``sync``: compiled in the calling process before its first call (tests,
  and a build step that wants its libraries in one go).
- ``off``: no fused tier at all.

A library's first call in a process is compared with the TorchScript
function's, once per library rather than once per process: a match is
stored as a signed verdict (:mod:`.verdicts`), and a process that finds it
runs the library alone from its first call.

``ltc-cache fuse`` compiles stored graphs' libraries ahead, with
:func:`fuse_graph` as the worker does.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from ...counter_names import (
    ERRORS,
    FUSED_CHECKS,
    FUSED_COMPILES,
    FUSED_LOADS,
    FUSED_PICKUPS,
    FUSED_QUEUED,
    FUSED_REFUSED,
)
from ...diagnostics import count_event, warn_once
from ...entries.entry import Entry
from ...entries.keys import CacheKey
from ...entries.kinds import EntryKind
from ...errors import CompileTimeout
from ...signing import program_secret
from ..replay import GraphFunction
from . import fused_kind  # noqa: F401 - registers the fused kind
from .deadline import running_deadline
from .library_entries import DATA_DEPENDENT, NOT_FASTER, refusal_entry
from .pickup import PendingFunction
from .platform import fusable_here, fused_key, source_key
from .queue import FuseQueue, start_worker
from .runner import load_runner
from .slot import LibrarySlot, SlotCounters

if TYPE_CHECKING:
    from ...entries.entry_cache import EntryCache

__all__ = ["FusedTier", "built_within", "fuse_graph", "in_a_clean_thread"]

logger = logging.getLogger("ltc_cache.fused")

_T = TypeVar("_T")

_COUNTERS = SlotCounters(loads=FUSED_LOADS, checks=FUSED_CHECKS, refused=FUSED_REFUSED)


class FusedTier:
    """The fused libraries of one cache's entries
    (:class:`~ltc_cache.entries.entry_cache.EntryCache`; a
    :class:`~ltc_cache.graph.cache.GraphCache` builds one over its own)."""

    def __init__(self, cache: EntryCache) -> None:
        self._cache = cache
        self._lock = threading.Lock()
        self._functions: dict[str, GraphFunction] = {}
        self._worker_started = False

    def function(self, entry: Entry, script: GraphFunction | None) -> GraphFunction | None:
        """What replays ``entry``: its library where one is to be had,
        else ``script`` (its TorchScript function). Never raises."""
        config = self._cache.config
        if config.fuse == "off" or script is None or entry.kind != EntryKind.GRAPH or not entry.key:
            return script
        if getattr(_reference, "depth", 0) and entry.key not in self._functions:
            return script  # run only to check a plan's library: nothing looked up or queued
        with self._lock:  # one lookup and load per graph and process, whatever the threads
            if entry.key not in self._functions:
                self._functions[entry.key] = self._guarded(self._obtain, entry, script)
            return self._functions[entry.key]

    def _guarded(self, obtain: Callable[[Entry, GraphFunction], GraphFunction], entry: Entry,
                 script: GraphFunction) -> GraphFunction:
        try:
            return obtain(entry, script)
        except Exception as exc:  # a store, a loader: never the user's failure
            self._cache.record(ERRORS)
            warn_once("fused", f"fused library of {entry.graph_name}: {exc}; "
                      "replaying with TorchScript")
            return script

    def _obtain(self, entry: Entry, script: GraphFunction) -> GraphFunction:
        config = self._cache.config
        if not fusable_here() or "input_specs" not in entry.meta:
            return script  # nothing to compile it for: an older entry, or not on the CPU
        source = source_key(entry)
        slot = LibrarySlot(self._cache, fused_key(source), entry, source, entry.graph_name,
                           _COUNTERS, instead="replaying with TorchScript",
                           quiet=(NOT_FASTER, DATA_DEPENDENT), refused_warning="fused-refused")
        stored = self._cache.lookup_entry(slot.key, count=False)
        if stored is None and config.fuse == "sync" and not self._cache.readonly:
            stored = in_a_clean_thread(fuse_graph, self._cache, entry.key, graph=entry)
        if stored is not None:
            return self._loaded(slot, stored, script)
        queued = self.queue(entry.key)
        if queued is None:
            return script
        return PendingFunction(script, queued, lambda: self._picked_up(slot, script))

    def _picked_up(self, slot: LibrarySlot, script: GraphFunction) -> GraphFunction:
        """What replays a queued graph once the worker is done with it: its
        library, loaded as any other, and from then on for every binding
        of the graph in this process."""
        def obtain(entry: Entry, script: GraphFunction) -> GraphFunction:
            stored = self._cache.lookup_entry(slot.key, count=False)
            if stored is None:  # taken off the queue uncompiled (a cleared queue)
                return script
            function = self._loaded(slot, stored, script)
            if function is not script:
                count_event(FUSED_PICKUPS)
                logger.info("picked up the fused library of %s (%s)", entry.graph_name,
                            entry.key[:12])
            return function

        function = self._guarded(obtain, slot.of, script)
        with self._lock:
            self._functions[slot.of.key] = function
        return function

    @staticmethod
    def _loaded(slot: LibrarySlot, stored: Entry, script: GraphFunction) -> GraphFunction:
        """The library of the fused entry ``stored``, loaded, or ``script``
        where it has none to be used."""
        library = slot.library(stored)
        if library is None:
            return script
        return slot.function(stored, library, load_runner(library.data), script)

    def expect_work(self) -> None:
        """A miss: this process is about to trace and store graphs, and then
        to queue them. The worker is started now, once a process, so that
        its compile processes import torch and Inductor on the core the
        tracing leaves idle (:mod:`.governor`), rather than after the
        queue fills. Never raises."""
        config = self._cache.config
        if self._worker_started or config.fuse != "background" or self._cache.readonly:
            return
        try:
            if fusable_here():
                self._start_worker()
        except (OSError, subprocess.SubprocessError) as exc:
            warn_once("fuse-worker", f"cannot start the fuse worker ({exc}); graphs run "
                      "without their libraries (`ltc-cache fuse` compiles them ahead)")

    def queue(self, key: str, counter: str = FUSED_QUEUED) -> str | None:
        """Queue the graph or plan stored under ``key`` for the background
        worker (started unless it runs already), counting it under
        ``counter``; the path of its file in the queue, None where it is
        not queued."""
        config = self._cache.config
        if config.fuse != "background" or self._cache.readonly:
            return None
        try:
            fuse_queue = FuseQueue(config.directory)
            queued = fuse_queue.put(key)
            count_event(counter)
            if not self._worker_started or not fuse_queue.worker_running():
                self._start_worker()
        except (OSError, subprocess.SubprocessError) as exc:
            warn_once("fuse-worker", f"cannot queue graphs for fusing ({exc}); they run "
                      "without their libraries (`ltc-cache fuse` compiles them ahead)")
            return None
        return str(queued)

    def _start_worker(self) -> None:
        self._worker_started = True
        start_worker(self._cache.config.directory)

# How deep this thread is in runs of a plan's per-region path made only to
# check the plan's library (:func:`regions_as_reference`).
_reference = threading.local()


@contextlib.contextmanager
def regions_as_reference() -> Iterator[None]:
    """Regions first run in the block run as TorchScript, their libraries
    neither looked up nor queued: the block is a plan library's first-call
    check, after which the library runs in their place. (Queued, a second
    run's check had the worker compile every region of GPT-2 small's step
    beside that run's steps.)"""
    _reference.depth = getattr(_reference, "depth", 0) + 1
    try:
        yield
    finally:
        _reference.depth -= 1


def fuse_graph(cache: EntryCache, graph_key: str, *, graph: Entry | None = None,
               retry: bool = False, timeout: float | None = None) -> Entry | None:
    """Compile and store the library of the graph stored under
    ``graph_key`` (``graph``: that entry, where the caller has it), unless
    its fused entry is stored already (``retry`` compiles a refused one
    again). Returns the fused entry, None where the graph is not stored.
    ``timeout``: seconds the compile may take (main thread only); past
    them it is refused."""
    from .build import build_entry

    if graph is None:
        graph = cache.lookup_entry(CacheKey(graph_key, {}), count=False)
        if graph is None or graph.kind != EntryKind.GRAPH:
            return None
    key = fused_key(source_key(graph))
    stored = cache.lookup_entry(key, count=False)
    if stored is not None and (not retry or "library" in stored.payload):
        return stored  # this graph's, or an identical one's (another layer's)
    secret = program_secret(cache.config.secret, cache.config.directory)
    entry = built_within(timeout, lambda: build_entry(graph, key, secret), key, graph)
    cache.store_entry(entry, key)
    return entry


def built_within(timeout: float | None, build: Callable[[], Entry], key: CacheKey,
                 of: Entry) -> Entry:
    """``build()``, or a refusal stored under ``key`` for ``of`` where it
    ran past ``timeout`` seconds (counted in the main thread only, and
    while the process runs: :mod:`.deadline`)."""
    count_event(FUSED_COMPILES)
    try:
        with running_deadline(timeout):
            return build()
    except CompileTimeout:
        return refusal_entry(key, of, f"the compile took over {timeout:g} s "
                             "(LTC_CACHE_FUSE_TIMEOUT)")


def in_a_clean_thread(fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """``fn(*args, **kwargs)`` in a thread of its own: a graph's first call
    may come inside Dynamo's or AOTAutograd's tracing, whose fake mode and
    tracing context (thread-local, both) AOTInductor's compile would pick up
    (docs/torch/aot-inductor.md#export-picks-up-surrounding-fake-mode)."""
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ltc_cache-fuse") as pool:
        return pool.submit(fn, *args, **kwargs).result()
