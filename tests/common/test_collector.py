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
