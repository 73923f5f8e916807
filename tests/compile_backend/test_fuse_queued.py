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
from ltc_cache.entries.kinds import EntryKind
from ltc_cache.graph.fused.library_entries import fused_entry, refusal_entry
from ltc_cache.graph.fused.queue import FuseQueue

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


def test_a_plan_another_process_finished_still_covers_its_regions(queued, monkeypatch):
    """Two compile processes side by side: this one meets the plan while the
    other holds its parts, and looks again after the other has stored both
    libraries and taken the plan off the queue. Its regions are covered
    all the same: none is compiled."""
    import contextlib

    cache, queue, kinds = queued
    (plan_key,) = [k for k, kind in kinds.items() if kind == EntryKind.PLAN]
    plan = cache.lookup_entry(worker.CacheKey(plan_key, {}), count=False)
    calls = _compile(monkeypatch, cache, set())
    claimed = queue.claimed

    @contextlib.contextmanager
    def parts_held_elsewhere(job):
        if job.startswith(plan_key + "."):
            yield False  # the other process compiles the plan's parts
            return
        with claimed(job) as mine:
            yield mine

    def other_process_finishes(_seconds):
        for part in worker.plan_parts(plan):
            if cache.lookup_entry(part_key(plan_key, part), count=False) is None:
                worker.fuse_plan_part(cache, plan, part)
        queue.done(plan_key)

    monkeypatch.setattr(queue, "claimed", parts_held_elsewhere)
    monkeypatch.setattr(worker.time, "sleep", other_process_finishes)
    worker.fuse_queued(cache, queue)
    assert [kinds[key] for key in calls] == [EntryKind.PLAN, EntryKind.PLAN]  # the other's
    assert queue.pending() == []



class Layer(torch.nn.Module):
    """One block of a model, held under the attribute its index names
    (``layer3.fc``): as a model's graphs name its layers' parameters."""

    def __init__(self, index: int) -> None:
        super().__init__()
        setattr(self, f"layer{index}", torch.nn.Linear(8, 8))
        self.index = index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(getattr(self, f"layer{self.index}")(x)) + x


@pytest.mark.parametrize("layers", [4, 12])
def test_identical_layers_are_one_compile_whatever_their_count(cache_dir, monkeypatch, layers):
    """Every layer's graph stored, each under its own key (its parameters'
    names differ), and queued: the worker compiles one library, which
    every layer's key finds."""
    from torch import fx

    from ltc_cache.graph.fused import build
    from ltc_cache.graph.fused.platform import fused_key, source_key

    cache = GraphCache(CacheConfig(directory=cache_dir, fuse="off"))
    x = torch.randn(4, 8)
    graphs = [cache.extract_compiled_graph(fx.symbolic_trace(Layer(i)), [x]).entry
              for i in range(layers)]
    assert len({graph.key for graph in graphs}) == layers
    queue = FuseQueue(cache_dir)
    for graph in graphs:
        queue.put(graph.key)
    compiled: list[str] = []

    def build_entry(graph, key, secret):
        compiled.append(graph.key)
        return refusal_entry(key, graph, "not faster: counted")

    monkeypatch.setattr(build, "build_entry", build_entry)
    worker.fuse_queued(cache, queue)
    assert len(compiled) == 1 and queue.pending() == []
    keys = {fused_key(source_key(graph)).digest for graph in graphs}
    assert len(keys) == 1 and cache.lookup_entry(worker.CacheKey(keys.pop(), {}), count=False)



class Attention(torch.nn.Module):
    """Causal attention between two projections: its backward's attention
    op runs eagerly between two regions, and the output projection's
    weight is saved transposed."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(8, 24), torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).unsqueeze(1).chunk(3, dim=-1)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.squeeze(1))


def test_a_backward_library_is_built_on_the_regions_the_run_stored(cache_dir, monkeypatch):
    """The backward's saved tensors laid out as a run hands them (a
    region's outputs are contiguous where AOTAutograd's graph records a
    transposed weight): building its library binds the regions the run
    stored, tracing none again."""
    import ltc_cache
    from ltc_cache.compile_backend import plan_library
    from ltc_cache.graph.fused import build
    from ltc_cache.signing import program_secret

    cache = GraphCache(CacheConfig(directory=cache_dir, fuse="off"))
    model = torch.compile(Attention(), backend=LtcBackend(cache))
    model(torch.randn(2, 6, 8)).sum().backward()
    (plan,) = [e for e in (cache.lookup_entry(worker.CacheKey(k, {}), count=False)
                           for k in cache.store.keys() if len(k) == 64)  # noqa: SIM118
               if e.kind == EntryKind.PLAN]
    stop = build.FuseFailed("compiled no further")

    def compile_library(*args, **kwargs):
        raise stop

    monkeypatch.setattr(build, "compile_library", compile_library)
    before = ltc_cache.stats().get("traces", 0)
    refused = plan_library.build_part(cache, plan, "backward", part_key(plan.key, "backward"),
                                      program_secret(b"s" * 32, cache.config.directory))
    assert refused.payload["reason"] == str(stop)  # the per-region path ran first
    assert ltc_cache.stats().get("traces", 0) == before
