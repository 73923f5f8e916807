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
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import fx

from ..collector import holding_off
from ..config import CacheConfig
from ..counter_names import HITS, MISSES, NEGATIVE_HITS, TRACES
from ..diagnostics import counters, warn_once
from ..entries.entry import Entry, decode, input_specs, new_meta
from ..entries.entry_cache import EntryCache
from ..entries.keys import CacheKey
from ..entries.kinds import EntryKind
from ..errors import (
    EntryError,
    GraphNotExtractable,
    RememberedFailure,
    UncacheableGraph,
    is_graph_failure,
    is_graph_failure_reason,
)
from ..store import Store
from ..threads import trace_lock
from . import graph_kind  # noqa: F401 - registers the graph and negative kinds
from .fused.tier import FusedTier
from .graph_keys import compute_key, module_tensors
from .replay import CompiledGraph, GraphFunction, build_function, check_usable, count_nodes

# Tracing (extract, rewrites: torch._lazy with them) and miss reports (names)
# are imported where a miss needs them: a warm process never does, and they
# cost it ~0.2 MiB of peak RSS (BENCHMARKS.md, memory).

__all__ = ["GraphCache", "default_cache", "extract_compiled_graph", "stats"]

logger = logging.getLogger("ltc_cache.cache")

_REASON_CHARS = 2000

class Built(NamedTuple):
    """An entry with its IR parsed, kept per process."""

    entry: Entry
    function: GraphFunction | None  # None for an entry without a graph (negative)


class GraphCache(EntryCache):
    """Compiled graphs of one cache configuration, over its entries
    (:class:`~ltc_cache.entries.entry_cache.EntryCache`, which every product
    uses).

    ``store`` overrides the tiers ``config`` would open (tests use a
    MemoryStore). Decoded entries and their parsed functions are kept per
    process, so a second model instance of a graph skips the store.
    """

    def __init__(self, config: CacheConfig | None = None, store: Store | None = None) -> None:
        super().__init__(config, store)
        self._built: dict[str, Built] = {}
        self.fused = FusedTier(self)

    def extract_compiled_graph(self, model: fx.GraphModule | Callable[[], fx.GraphModule],
                               example_inputs: Sequence[Any], *, name: str | None = None,
                               digest: str | None = None,
                               tensors: Mapping[str, torch.Tensor] | None = None
                               ) -> CompiledGraph:
        """See :func:`ltc_cache.extract_compiled_graph`; ``digest`` and
        ``tensors``: see :func:`~ltc_cache.graph.graph_keys.graph_parts`. Given
        both, ``model`` may be what builds the graph, called only where it
        is traced (a stored plan's region,
        docs/torch/aot-autograd.md#stored-regions-built-only-when-needed)."""
        store = self.store
        # Resolved once for the key, the entry check and the binding.
        tensors = module_tensors(_built(model)) if tensors is None else tensors
        try:
            key = (compute_key(model, example_inputs, tensors=tensors, digest=digest)
                   if store is not None else None)
        except UncacheableGraph as exc:
            warn_once("uncacheable", f"{exc}; tracing without the cache")
            key = None
        if key is None or store is None:
            model = _built(model)
            with trace_lock:
                built = self._trace(model, example_inputs, name, None, tensors)
            return self._bind(built, tensors)

        built = self._lookup(store, key.digest, tensors, len(example_inputs))
        if built is None:
            # One trace of a key: at a time in the process (trace_lock,
            # ltc_cache/threads.py), and across processes (the file lock).
            with trace_lock, self.single_flight(store, key.digest):
                # Another thread or process may have made it while we waited.
                built = self._lookup(store, key.digest, tensors, len(example_inputs))
                if built is None:
                    self.record(MISSES, key.digest)
                    self.fused.expect_work()
                    model = _built(model)
                    graph_name = name or type(model).__name__
                    from ..entries.miss_reasons import explain_miss

                    logger.info("miss %s (%s): %s", key.digest[:12], graph_name,
                                explain_miss(store, key, graph_name))
                    try:
                        built = self._trace(model, example_inputs, name, key, tensors)
                    except RuntimeError as exc:
                        if is_graph_failure(exc):
                            self._remember_failure(store, key, graph_name, exc)
                        raise
                    self._put(store, built.entry)
                    self._remember_name(store, key, graph_name)
                    return self._bind(built, tensors)
        self.record(HITS, key.digest)
        logger.info("hit %s (%s)", key.digest[:12], built.entry.graph_name)
        return self._bind(built, tensors)

    def _trace(self, model: fx.GraphModule, example_inputs: Sequence[Any], name: str | None,
               key: CacheKey | None, tensors: Mapping[str, torch.Tensor]) -> Built:
        self.record(TRACES, key.digest if key else None)
        from .extract import trace
        from .rewrites import rewrite

        # Rewritten once here, so every process that loads the entry gains.
        extraction = rewrite(trace(model, example_inputs))
        function = build_function(extraction.ir)
        meta = new_meta(
            graph_name=name or type(model).__name__,
            node_count=count_nodes(extraction.ir),
            graph_hash=extraction.graph_hash,
            key_parts=key.parts if key else {},
        )
        # What the fused tier compiles the graph for, from the entry alone.
        specs = input_specs(extraction.inputs, example_inputs, tensors)
        if specs is not None:
            meta["input_specs"] = specs
        entry = Entry(key.digest if key else "", extraction.ir, extraction.inputs,
                      extraction.outputs, extraction.updates, meta)
        built = Built(entry, function)
        if key is not None:
            self._built[key.digest] = built
        return built

    # A warm start's decode and parse (docs/torch/dynamo.md#cyclic-gc-during-warm-loads).
    @holding_off()
    def _lookup(self, store: Store, key: str, tensors: Mapping[str, torch.Tensor],
                num_args: int) -> Built | None:
        if key in self._built:
            return self._built[key]
        try:
            data = store.get(key)
        except EntryError as exc:
            return self._corrupt(store, key, str(exc))
        except Exception as exc:
            return self._error("read", f"cannot read the cache ({exc}); tracing instead"
                               f"{self._where()}")
        if data is None:
            return None
        try:
            entry = decode(data, expected_key=key, secret=self.config.secret)
            function = build_function(entry.ir)
            check_usable(entry, function, tensors, num_args)
        except EntryError as exc:
            return self._corrupt(store, key, str(exc))
        except RuntimeError as exc:  # the stored IR does not parse
            return self._corrupt(store, key, f"entry {key[:12]}: IR does not parse ({exc})")
        if entry.kind == EntryKind.NEGATIVE \
                and not is_graph_failure_reason(str(entry.payload.get("reason", ""))):
            # A reason that is the process's, not the graph's (a replay that
            # ran out of memory is remembered with what it raised): the next
            # process may well succeed. Dropped, traced again.
            logger.info("dropping negative entry %s: %s", key[:12], entry.payload.get("reason"))
            if not self._readonly:
                with contextlib.suppress(Exception):
                    store.delete(key)
            return None
        self._built[key] = built = Built(entry, function)
        return built

    def _remember_failure(self, store: Store, key: CacheKey, graph_name: str,
                          exc: BaseException) -> None:
        """Store a negative entry: no later process traces this graph again."""
        meta = new_meta(graph_name=graph_name, node_count=0, graph_hash="",
                        key_parts=key.parts)
        reason = str(exc)[:_REASON_CHARS] or type(exc).__name__
        self._put(store, Entry(key.digest, "", (), (), (), meta, kind=EntryKind.NEGATIVE,
                               payload={"reason": reason}))
        self._remember_name(store, key, graph_name)

    def remember_replay_failure(self, compiled: CompiledGraph, exc: BaseException) -> None:
        """A graph that traced but whose replay failed on its first call:
        its entry becomes a negative one, so that later processes run the
        graph eagerly at once instead of failing the same way (the entry's
        key and its parts come from the entry itself)."""
        entry = compiled.entry
        store = self.store
        if store is None or not entry.key or entry.kind == EntryKind.NEGATIVE:
            return
        self._built.pop(entry.key, None)
        key = CacheKey(entry.key, dict(entry.meta.get("key_parts") or {}))
        self._remember_failure(store, key, entry.graph_name,
                               GraphNotExtractable(f"replay failed: {type(exc).__name__}: {exc}"))

    def _bind(self, built: Built, tensors: Mapping[str, torch.Tensor]) -> CompiledGraph:
        entry = built.entry
        if entry.kind == EntryKind.NEGATIVE:
            self.record(NEGATIVE_HITS)
            reason = entry.payload.get("reason", "LTC cannot extract this graph")
            raise RememberedFailure(f"{reason} (remembered in entry {entry.key[:12]})")
        return CompiledGraph(entry, self.fused.function(entry, built.function), None,
                             tensors=tensors)


def _built(model: fx.GraphModule | Callable[[], fx.GraphModule]) -> fx.GraphModule:
    return model if isinstance(model, fx.GraphModule) else model()


@functools.lru_cache(maxsize=8)
def _cache_for(config: CacheConfig) -> GraphCache:
    return GraphCache(config)


# lru_cache may run _cache_for twice for threads that miss at once: two
# caches of one directory would each keep the graphs they parsed.
_default_lock = threading.Lock()


def default_cache() -> GraphCache:
    """The cache the environment (``LTC_CACHE_*``) configures, one per
    configuration in a process."""
    config = CacheConfig.from_env()
    with _default_lock:
        return _cache_for(config)


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
