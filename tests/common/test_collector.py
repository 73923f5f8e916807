"""The cyclic garbage collector is held off while a warm start rebuilds
what it stored (``ltc_cache.collector``; docs/torch/dynamo.md#cyclic-gc-during-warm-loads)."""

from __future__ import annotations

import gc

import pytest

from ltc_cache.collector import holding_off


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_off_inside_on_after_even_on_an_error(collector_on):
    with holding_off():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), holding_off():
        raise ValueError
    assert gc.isenabled()


def test_nested_blocks_turn_it_on_once_the_outer_ends(collector_on):
    with holding_off():
        with holding_off():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_the_user_turned_off_stays_off(collector_on):
    gc.disable()
    with holding_off():
        pass
    assert not gc.isenabled()


def test_a_decorated_function_keeps_its_name_and_result(collector_on):
    @holding_off()
    def probe(x):
        """Doc."""
        return x, gc.isenabled()

    assert probe(3) == (3, False)
    assert probe(4) == (4, False)  # the decorator holds it off on every call
    assert probe.__name__ == "probe" and probe.__doc__ == "Doc."
    assert gc.isenabled()


def test_a_loaded_program_graph_compiles_with_it_off(collector_on, monkeypatch):
    """A loaded program's graph is compiled on its first call (made
    canonical, its plan bound): allocations of a load too, where a
    collection of the oldest generation had made a served bucket's first
    token 0.27 s instead of 0.09 s."""
    import torch
    from torch import fx

    from ltc_cache.compile_backend.backend import LtcBackend
    from ltc_cache.program.program_graph import LtcProgramGraph

    seen = []

    def compile_(self, gm, args, **kwargs):
        seen.append(gc.isenabled())
        return gm.forward

    monkeypatch.setattr(LtcBackend, "__call__", compile_)
    graph = LtcProgramGraph(fx.symbolic_trace(lambda x: x + 1), "probe", whole=False)
    assert torch.equal(graph(torch.ones(2)), torch.full((2,), 2.0))
    assert seen == [False] and gc.isenabled()


def _walks_of_the_oldest(during):
    """How many collections of the oldest generation ``during()`` starts."""
    walks = []

    def seen(phase, info):
        if phase == "start" and info["generation"] == 2:
            walks.append(info)

    gc.callbacks.append(seen)
    try:
        during()
    finally:
        gc.callbacks.remove(seen)
    return len(walks)


def _young_collections():
    """Cyclic garbage enough for hundreds of young collections, tens of them
    of the middle generation (each of which may start a walk of the oldest)."""
    for _ in range(300_000):
        pair = [], []
        pair[0].append(pair[1])
        pair[1].append(pair[0])


def test_what_a_load_keeps_schedules_no_walk_of_the_oldest_generation(collector_on):
    """CPython walks the oldest generation once the objects promoted into it
    since its last walk reach a quarter of it; a load's kept objects go
    there uncounted, so loads alone never make a walk come due (a walk of a
    served process's heap took 0.17 s of a request's first token)."""
    gc.collect()
    kept_size = len(gc.get_objects()) // 2  # well over the quarter

    def load():
        return [[] for _ in range(kept_size)]

    def held_off_load():
        with holding_off():
            kept.append(load())
        _young_collections()

    kept = []
    assert _walks_of_the_oldest(held_off_load) == 0
    assert any(o is kept[0] for o in gc.get_objects(generation=2))

    # The same load with the collector running counts its objects as it
    # promotes them, and a walk comes due: what the test tells apart.
    gc.collect()
    assert _walks_of_the_oldest(lambda: (kept.append(load()), _young_collections())) >= 1


def test_a_loads_cyclic_garbage_is_collected_as_it_ends(collector_on):
    import weakref

    class Node:
        pass

    with holding_off():
        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
    assert gone() is None


def test_what_the_user_froze_stays_frozen(collector_on):
    frozen = [[] for _ in range(10)]
    gc.freeze()
    try:
        with holding_off():
            pass
        # Still in the permanent generation, which get_objects leaves out.
        assert not any(o is frozen for o in gc.get_objects())
    finally:
        gc.unfreeze()
