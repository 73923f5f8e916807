"""The background worker's order (ltc_cache/compile_backend/fuse_queued.py):
a training step's plan first, and its regions only where a part of the
plan has no library. A real plan and real regions (WithSign: two regions a
graph), the compile itself replaced."""

from __future__ import annotations

import pytest
import torch

from ltc_cache import CacheConfig, GraphCache, LtcBackend
from ltc_cache.compile_backend import fuse_queued as worker
from ltc_cache.compile_backend.plan_library import part_key
from ltc_cache.graph.fused.entries import fused_entry, refusal_entry
from ltc_cache.graph.fused.queue import FuseQueue
from ltc_cache.kinds import EntryKind

pytestmark = pytest.mark.usefixtures("dynamo_reset")


class WithSign(torch.nn.Module):
    """``aten.sign`` runs eagerly between two LTC regions."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x))
        return self.fc2(torch.sign(h) * h.exp() + h)


@pytest.fixture
def queued(cache_dir):
    """A trained step's plan and regions stored, every one of them queued."""
    cache = GraphCache(CacheConfig(directory=cache_dir, fuse="off"))
    model = torch.compile(WithSign(), backend=LtcBackend(cache))
    model(torch.randn(4, 8)).sum().backward()
    queue = FuseQueue(cache_dir)
    kinds = {}
    for key in cache.store.keys():  # noqa: SIM118 (a store, not a dict)
        if len(key) == 64:
            entry = cache.lookup_entry(worker.CacheKey(key, {}), count=False)
            kinds[key] = entry.kind
            if entry.kind in (EntryKind.PLAN, EntryKind.GRAPH):
                queue.put(key)
    assert list(kinds.values()).count(EntryKind.GRAPH) >= 3
    return cache, queue, kinds


def _compile(monkeypatch, cache, refuse: set[str]) -> list[str]:
    """The compile replaced: a plan's part gets a library (a refusal where
    ``refuse`` names it); each key compiled, in order (a plan's once a part)."""
    calls: list[str] = []

    def fuse_plan_part(_cache, plan, part, *, timeout=None):
        calls.append(plan.key)
        key = part_key(plan.key, part)
        made = (refusal_entry(key, plan, "not faster") if part in refuse else
                fused_entry(key, plan, library=b"lib", isa="", aliases=[], restride=[],
                            secret=b"s" * 32, stats={}))
        cache.store_entry(made, key)
        return made

    monkeypatch.setattr(worker, "fuse_plan_part", fuse_plan_part)
    monkeypatch.setattr(worker, "fuse_stored", lambda _cache, key, **kw: calls.append(key))
    return calls


def test_a_plan_whose_libraries_are_kept_is_compiled_and_its_regions_are_not(
        queued, monkeypatch):
    cache, queue, kinds = queued
    calls = _compile(monkeypatch, cache, set())
    worker.fuse_queued(cache, queue)
    assert [kinds[key] for key in calls] == [EntryKind.PLAN, EntryKind.PLAN]  # two parts
    assert queue.pending() == []


def test_the_regions_of_a_refused_part_are_compiled_after_the_plan(queued, monkeypatch):
    cache, queue, kinds = queued
    calls = _compile(monkeypatch, cache, {"backward"})
    worker.fuse_queued(cache, queue)
    assert [kinds[key] for key in calls[:2]] == [EntryKind.PLAN, EntryKind.PLAN]
    regions = [cache.lookup_entry(worker.CacheKey(k, {}), count=False).graph_name
               for k in calls[2:]]
    assert regions and all(".backward." in name for name in regions), regions
    assert queue.pending() == []
