"""GraphCache over a MemoryStore: lookup, single flight, trace, store, the
entry API of plans and programs (store, look up, drop) and counting, in
this process and without a cache directory."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch._lazy.config
from helpers import delta

import ltc_cache
from ltc_cache import CacheConfig, GraphCache
from ltc_cache.compile_backend.plan_compile import lookup_plan
from ltc_cache.entries.entry import Entry, decode, new_meta
from ltc_cache.entries.keys import derived_key
from ltc_cache.entries.wire import is_entry_key
from ltc_cache.errors import GraphNotExtractable, RememberedFailure, is_graph_failure
from ltc_cache.graph.graph_keys import compute_key
from ltc_cache.store import MemoryStore
from zoo.corner_models import build, check_against_eager, random_inputs


class CountingStore(MemoryStore):
    """A MemoryStore that remembers the events the cache records in it."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, str | None]] = []

    def record(self, event: str, key: str | None) -> None:
        self.events.append((event, key))


def cache_over(store: MemoryStore, tmp_path) -> GraphCache:
    # The directory is never opened: the store given replaces the tiers.
    return GraphCache(CacheConfig(directory=tmp_path / "unused"), store=store)


def entry_keys(store: MemoryStore) -> list[str]:
    return [k for k in list(store.keys()) if is_entry_key(k)]


def test_a_miss_traces_and_stores_one_entry(tmp_path):
    store = CountingStore()
    gm, shapes = build("weighted")
    example = random_inputs(shapes, seed=1)
    before = ltc_cache.stats()
    compiled = cache_over(store, tmp_path).extract_compiled_graph(gm, example, name="w")
    check_against_eager(gm, compiled, shapes)
    assert delta(before) == {"hits": 0, "misses": 1, "traces": 1, "stores": 1, "errors": 0}
    key = compute_key(gm, example).digest
    assert entry_keys(store) == [key]
    entry = decode(store.get(key), expected_key=key)
    assert entry.graph_name == "w" and entry.kind == "graph"
    # The store's hook saw what the process counters saw, under the key.
    assert store.events == [("misses", key), ("traces", key), ("stores", key)]
    assert not (tmp_path / "unused").exists()


def test_a_new_cache_on_the_same_store_hits_without_tracing(tmp_path):
    store = CountingStore()
    gm, shapes = build("weighted")
    example = random_inputs(shapes, seed=1)
    cache_over(store, tmp_path).extract_compiled_graph(gm, example)
    before = ltc_cache.stats()
    warm = cache_over(store, tmp_path).extract_compiled_graph(gm, example)
    check_against_eager(gm, warm, shapes)
    assert delta(before) == {"hits": 1, "misses": 0, "traces": 0, "stores": 0, "errors": 0}
    assert store.events[-1] == ("hits", compute_key(gm, example).digest)


def test_one_cache_traces_a_graph_once(tmp_path):
    store = MemoryStore()
    cache = cache_over(store, tmp_path)
    gm, shapes = build("sub")
    before = ltc_cache.stats()
    for seed in range(3):
        compiled = cache.extract_compiled_graph(gm, random_inputs(shapes, seed=seed))
        check_against_eager(gm, compiled, shapes)
    assert delta(before) == {"hits": 2, "misses": 1, "traces": 1, "stores": 1, "errors": 0}
    assert len(entry_keys(store)) == 1


def test_a_corrupt_entry_is_dropped_and_traced_again(tmp_path):
    store = MemoryStore()
    gm, shapes = build("weighted")
    example = random_inputs(shapes, seed=1)
    key = compute_key(gm, example).digest
    store.put(key, b"not an entry")
    before = ltc_cache.stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = cache_over(store, tmp_path).extract_compiled_graph(gm, example)
    check_against_eager(gm, compiled, shapes)
    assert delta(before) == {"hits": 0, "misses": 1, "traces": 1, "stores": 1, "errors": 1}
    assert [str(w.message) for w in caught if "traced again" in str(w.message)]
    assert decode(store.get(key), expected_key=key).ir == compiled.entry.ir


def test_a_graph_ltc_refuses_is_a_negative_entry_and_not_traced_again(tmp_path):
    store = MemoryStore()
    gm, shapes = build("sub")
    example = random_inputs(shapes, seed=1)
    old = torch._lazy.config.get_force_fallback()
    torch._lazy.config.set_force_fallback("aten::sub")
    try:
        with pytest.raises(GraphNotExtractable, match="fallback") as first:
            cache_over(store, tmp_path).extract_compiled_graph(gm, example)
        before = ltc_cache.stats()
        with pytest.raises(RememberedFailure, match="remembered in entry") as again:
            cache_over(store, tmp_path).extract_compiled_graph(gm, example)
    finally:
        torch._lazy.config.set_force_fallback(old)
    assert delta(before) == {"hits": 1, "misses": 0, "traces": 0, "stores": 0, "errors": 0,
                             "negative_hits": 1}
    (key,) = entry_keys(store)
    entry = decode(store.get(key), expected_key=key)
    assert entry.kind == "negative" and "fallback" in entry.payload["reason"]
    # Told by type, and still what callers have always caught.
    assert is_graph_failure(first.value) and is_graph_failure(again.value)
    assert isinstance(again.value, RuntimeError)
    assert isinstance(again.value, ltc_cache.LtcCacheError)


def test_an_entry_made_elsewhere_is_stored_looked_up_counted_and_dropped(tmp_path):
    """The entry API the backend's plans and ltc_cache.compile's programs use."""
    store = CountingStore()
    cache = cache_over(store, tmp_path)
    gm, shapes = build("weighted")
    key = derived_key(compute_key(gm, random_inputs(shapes, seed=1)), made="elsewhere")
    before = ltc_cache.stats()
    assert lookup_plan(cache, key) is None  # a plan miss
    meta = new_meta(graph_name="made.plan", node_count=0, graph_hash="", key_parts=key.parts)
    cache.store_entry(Entry(key.digest, "", (), (), (), meta), key)
    assert entry_keys(store) == [key.digest]
    found = lookup_plan(cache, key)
    assert found is not None and found.graph_name == "made.plan"
    cache.record("plan_hits")
    with pytest.warns(RuntimeWarning, match="unusable here"):
        cache.drop_entry(key, "unusable here")
    assert store.get(key.digest) is None and cache.lookup_entry(key) is None
    assert delta(before) == {"hits": 1, "misses": 0, "traces": 0, "stores": 1, "errors": 1,
                             "plan_misses": 1, "plan_hits": 1}
    # Each of them is one the store's ledger keeps, so it saw them all.
    assert store.events == [("plan_misses", None), ("stores", key.digest),
                            ("hits", key.digest), ("plan_hits", None), ("errors", None)]


def test_counts_of_this_process_only_stay_out_of_the_store(tmp_path):
    store = CountingStore()
    cache = cache_over(store, tmp_path)
    before = ltc_cache.stats()
    cache.record("negative_hits")
    cache.record("misses", "k" * 64)
    assert delta(before)["negative_hits"] == 1 and delta(before)["misses"] == 1
    assert store.events == [("misses", "k" * 64)]


def test_a_read_only_cache_records_nothing_in_its_store(tmp_path):
    store = CountingStore()
    gm, shapes = build("weighted")
    example = random_inputs(shapes, seed=1)
    cache_over(store, tmp_path).extract_compiled_graph(gm, example)
    events = list(store.events)
    config = CacheConfig(directory=tmp_path / "unused", readonly=True)
    before = ltc_cache.stats()
    GraphCache(config, store=store).extract_compiled_graph(gm, example)
    assert delta(before)["hits"] == 1
    assert store.events == events
