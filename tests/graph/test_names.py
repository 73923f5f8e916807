"""Entries are named after the compiled module's class (issue 14, item 3),
and a miss is explained against entries of that name only."""

from __future__ import annotations

import logging

import torch

from ltc_cache import CacheConfig
from ltc_cache.report import scan
from ltc_cache.store import ReadOnlyDiskStore
from zoo.compile_models import Net, Net2


def names(directory) -> list[str]:
    """The name of each entry."""
    store = ReadOnlyDiskStore(directory)
    try:
        return [e.graph_name for e in scan(store).entries]
    finally:
        store.close()


def test_a_graph_break_inside_a_submodule_keeps_the_models_name(cache_dir, dynamo_reset,
                                                                  caplog, capsys):
    model = Net()
    # A hook that prints: Dynamo breaks the graph inside fc1's call and
    # compiles Linear.forward and a resume function of Net.forward.
    model.fc1.register_forward_hook(lambda module, args, out: print("fc1", tuple(out.shape)))
    x = torch.randn(3, 8)
    with torch.no_grad():
        got = torch.compile(model, backend="ltc_cache")(x)
    torch.testing.assert_close(got, model(x))
    first = names(cache_dir)
    # Two graphs (Linear.forward's, then the rest of Net.forward), both the model's.
    assert len(first) == 2 and set(first) == {"Net.inference"}, first

    other = Net2()
    other.fc1.register_forward_hook(lambda module, args, out: print("fc1", tuple(out.shape)))
    caplog.set_level(logging.INFO, logger="ltc_cache")
    with torch.no_grad():
        torch.compile(other, backend="ltc_cache")(x)
    # Linear.forward's graph is the same as Net's (one entry, one key); the
    # rest is Net2's own, and its miss is not explained by Net's entries.
    added = [n for n in names(cache_dir) if n not in first]
    assert added == ["Net2.inference"], added
    misses = [r.getMessage() for r in caplog.records if r.getMessage().startswith("miss ")]
    assert misses and all("no entry of that name yet" in m for m in misses), misses
    assert CacheConfig.from_env().directory == cache_dir
