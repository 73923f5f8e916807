"""The cache in front of tracing: key -> lookup -> hit, or lock -> look
again -> trace -> store.

A cache is best effort: a store or decode failure never breaks the user's
model. It warns once, counts an error, and traces.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from torch import fx

from .config import CacheConfig
from .diagnostics import counters, warn_once
from .entry import Entry, decode, encode, new_meta
from .errors import EntryError, LockTimeout, UncacheableGraph
from .extract import trace
from .keys import CacheKey, compute_key
from .replay import CompiledGraph, GraphFunction, build_function, count_nodes
from .store import DiskStore, Store

__all__ = ["GraphCache", "default_cache", "extract_compiled_graph", "stats"]

logger = logging.getLogger("ltc_cache.cache")


class GraphCache:
    """Compiled graphs of one cache configuration.

    ``store`` overrides the tiers ``config`` would open (tests use a
    MemoryStore). Decoded entries and their parsed functions are kept per
    process, so a second model instance of a graph skips the store.
    """

    def __init__(self, config: CacheConfig | None = None, store: Store | None = None) -> None:
        self.config = config or CacheConfig.from_env()
        self._store = store
        self._store_opened = store is not None
        self._open_lock = threading.Lock()
        self._built: dict[str, tuple[Entry, GraphFunction | None, int]] = {}

    @property
    def store(self) -> Store | None:
        """The storage tiers, opened on first use; None when they cannot be."""
        with self._open_lock:
            if not self._store_opened:
                self._store_opened = True
                self._store = self._open_store()
            return self._store

    def _open_store(self) -> Store | None:
        if self.config.disable:
            return None
        try:
            return DiskStore(self.config.directory, max_size=self.config.max_size)
        except Exception as exc:
            self._error("open", f"cannot use cache directory {self.config.directory} "
                        f"({exc}); running uncached")
            return None

    def extract_compiled_graph(self, model: fx.GraphModule, example_inputs: Sequence[Any], *,
                               name: str | None = None) -> CompiledGraph:
        """See :func:`ltc_cache.extract_compiled_graph`."""
        store = self.store
        try:
            key = compute_key(model, example_inputs) if store is not None else None
        except UncacheableGraph as exc:
            warn_once("uncacheable", f"{exc}; tracing without the cache")
            key = None
        if key is None or store is None:
            return self._bind(self._trace(model, example_inputs, name, None), model)

        built = self._lookup(store, key.digest)
        if built is None:
            with self._single_flight(store, key.digest):
                # Another process may have stored it while we waited.
                built = self._lookup(store, key.digest)
                if built is None:
                    self._count("misses", key.digest)
                    logger.info("miss %s (%s)", key.digest[:12], name or "graph")
                    built = self._trace(model, example_inputs, name, key)
                    self._put(store, built[0])
                    return self._bind(built, model)
        self._count("hits", key.digest)
        logger.info("hit %s (%s)", key.digest[:12], built[0].graph_name)
        return self._bind(built, model)

    def _trace(self, model: fx.GraphModule, example_inputs: Sequence[Any], name: str | None,
               key: CacheKey | None) -> tuple[Entry, GraphFunction | None, int]:
        extraction = trace(model, example_inputs)
        self._count("traces", key.digest if key else None)
        function, num_outputs = build_function(extraction.ir) if extraction.ir else (None, 0)
        meta = new_meta(
            graph_name=name or type(model).__name__,
            node_count=count_nodes(extraction.ir),
            graph_hash=extraction.graph_hash,
            key_parts=key.parts if key else {},
        )
        entry = Entry(key.digest if key else "", extraction.ir, extraction.inputs,
                      extraction.outputs, extraction.updates, meta)
        built = (entry, function, num_outputs)
        if key is not None:
            self._built[key.digest] = built
        return built

    def _lookup(self, store: Store, key: str) -> tuple[Entry, GraphFunction | None, int] | None:
        if key in self._built:
            return self._built[key]
        try:
            data = store.get(key)
        except EntryError as exc:
            return self._error("corrupt", f"{exc}; it will be traced again")
        except Exception as exc:
            return self._error("read", f"cannot read the cache ({exc}); tracing instead")
        if data is None:
            return None
        try:
            entry = decode(data, expected_key=key)
            function, num_outputs = build_function(entry.ir) if entry.ir else (None, 0)
        except EntryError as exc:
            return self._error("corrupt", f"{exc}; it will be traced again")
        except RuntimeError as exc:  # the stored IR does not parse
            return self._error("corrupt", f"entry {key[:12]}: IR does not parse ({exc}); "
                               "it will be traced again")
        self._built[key] = built = (entry, function, num_outputs)
        return built

    def _put(self, store: Store, entry: Entry) -> None:
        if self.config.readonly:
            return
        try:
            store.put(entry.key, encode(entry))
        except Exception as exc:
            self._error("write", f"cannot write the cache ({exc}); continuing uncached")
            return
        self._count("stores", entry.key)

    @contextlib.contextmanager
    def _single_flight(self, store: Store, key: str) -> Iterator[None]:
        """One process traces a key while the others wait, then load."""
        if self.config.readonly:
            yield
            return
        try:
            lock = store.lock(key, self.config.lock_timeout)
            lock.__enter__()
        except LockTimeout as exc:
            warn_once("lock-timeout", f"{exc}; tracing in this process too")
            lock = None
        except OSError as exc:
            self._error("lock", f"cannot lock in the cache directory ({exc}); "
                        "tracing without the lock")
            lock = None
        try:
            yield
        finally:
            if lock is not None:
                lock.__exit__(None, None, None)

    def _bind(self, built: tuple[Entry, GraphFunction | None, int],
              model: fx.GraphModule) -> CompiledGraph:
        entry, function, num_outputs = built
        return CompiledGraph(entry, function, num_outputs, model)

    def _count(self, event: str, key: str | None) -> None:
        counters.bump(event)
        if self._store is not None:
            self._store.record(event, key)

    def _error(self, topic: str, message: str) -> None:
        self._count("errors", None)
        warn_once(topic, message)
        return None


@functools.lru_cache(maxsize=8)
def _cache_for(config: CacheConfig) -> GraphCache:
    return GraphCache(config)


def default_cache() -> GraphCache:
    """The cache the environment (``LTC_CACHE_*``) configures, one per
    configuration in a process."""
    return _cache_for(CacheConfig.from_env())


def extract_compiled_graph(model: fx.GraphModule, example_inputs: Sequence[Any], *,
                           name: str | None = None) -> CompiledGraph:
    """Like ``torch._lazy.extract_compiled_graph``, backed by the on-disk cache.

    Returns a callable that replays the graph LTC traced for ``model`` on
    inputs laid out like ``example_inputs`` and returns the list of its
    outputs. A hit rebuilds it from the stored entry without tracing; a miss
    traces, syncs and stores. Parameters, buffers and tensor attributes are
    read live from ``model`` at each call. ``name`` labels the entry in
    ``ltc-cache ls``.
    """
    return default_cache().extract_compiled_graph(model, example_inputs, name=name)


def stats() -> dict[str, int]:
    """This process's counters: hits, misses, traces, stores, errors."""
    return counters.snapshot()
