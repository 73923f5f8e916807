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
