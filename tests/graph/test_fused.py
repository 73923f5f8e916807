"""The fused tier without a compiler: its key, its signed entries, the
checks a library passes before and on its first use (and the verdict kept
once it passed), a library picked up by the process that queued it, and
what a process does where none can be had. Compiling for real:
tests/graph/test_fused_build.py."""

from __future__ import annotations

import functools
import hashlib
import threading
import time
import warnings

import pytest
import torch
from helpers import CPU_KINDS
from torch import fx, nn

import ltc_cache
from ltc_cache import CacheConfig, GraphCache
from ltc_cache.diagnostics import counters
from ltc_cache.entries.keys import CacheKey
from ltc_cache.entries.wire import read_record, write_record
from ltc_cache.errors import EntryError
from ltc_cache.graph.fused import cpu_isa, pickup, platform, tier, verdicts
from ltc_cache.graph.fused.library_entries import fused_entry, library_of, refusal_entry
from ltc_cache.graph.fused.pickup import PendingFunction
from ltc_cache.graph.fused.platform import fused_key, source_key
from ltc_cache.graph.fused.runner import FusedFunction, mismatch
from ltc_cache.graph.replay import build_function
from ltc_cache.store import MemoryStore

SECRET = b"s" * 32


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def library_key(graph) -> CacheKey:
    """Where the library of the graph entry ``graph`` is stored."""
    return fused_key(source_key(graph))


def cache_over(store: MemoryStore, tmp_path, fuse: str) -> GraphCache:
    return GraphCache(CacheConfig(directory=tmp_path / "ltc", secret=SECRET, fuse=fuse),
                      store=store)


def stored_graph(cache: GraphCache):
    """A traced graph: its entry, its model and an input."""
    torch.manual_seed(0)
    model, x = Small(), torch.randn(2, 4)
    compiled = cache.extract_compiled_graph(fx.symbolic_trace(model), [x])
    return compiled.entry, model, x


# -- the key -----------------------------------------------------------------------------------


def test_the_key_names_the_graph_cpu_compiler_and_build(monkeypatch):
    graph = "a" * 64
    base = fused_key(graph)
    assert fused_key(graph) == base and fused_key("b" * 64) != base
    monkeypatch.setattr(platform, "compiler_id", lambda: "/usr/bin/g++-99:1:2")
    assert fused_key(graph).digest != base.digest
    monkeypatch.undo()
    monkeypatch.setenv("TORCHINDUCTOR_MAX_AUTOTUNE", "1")
    assert fused_key(graph).digest != base.digest


def test_each_cpu_feature_set_has_keys_of_its_own(monkeypatch):
    """Every feature a library may use is in the key: CPUs that torch's
    dispatcher calls alike ("AVX512" on Skylake-X, Ice Lake and Sapphire
    Rapids) keep their libraries apart, and ATEN_CPU_CAPABILITY=avx2 makes
    any of them an AVX2 machine."""
    keys = {}
    for name, features in CPU_KINDS.items():
        _as_cpu(monkeypatch, features)
        keys[name] = fused_key("a" * 64).digest
        assert fused_key("a" * 64).digest == keys[name]
    assert len(set(keys.values())) == len(CPU_KINDS)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert fused_key("a" * 64).digest == keys["Zen 2 (AVX2)"]


class Named(nn.Module):
    """``relu(x @ w.T * 0.5 + b)``, its layer under the attribute ``name``;
    the 0.5 a constant input of the graph."""

    def __init__(self, name: str, width: int = 4) -> None:
        super().__init__()
        self.name = name
        setattr(self, name, nn.Linear(width, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layer = getattr(self, self.name)
        return torch.relu(torch.nn.functional.linear(x, layer.weight) * 0.5 + layer.bias)


def test_a_librarys_key_is_the_graphs_content_not_its_names(tmp_path):
    """Layers that differ only in their parameters' names are entries of
    their own and one library; another layout is another library. The
    listing reads the same digest from the stored bytes, without torch."""
    from ltc_cache.entries.entry import encode
    from ltc_cache.entries.kind_registry import summarise

    cache = cache_over(MemoryStore(), tmp_path, "off")

    def entry(name, width=4, batch=2):
        return cache.extract_compiled_graph(fx.symbolic_trace(Named(name, width)),
                                            [torch.randn(batch, width)]).entry

    first, second = entry("layer1"), entry("layer2")
    assert any(s.kind == "const" for s in first.inputs)
    assert first.key != second.key and first.ir == second.ir
    assert source_key(first) == source_key(second)
    assert library_key(first) == library_key(second)
    assert len({source_key(first), source_key(entry("layer1", width=5)),
                source_key(entry("layer1", batch=3))}) == 3
    for graph in (first, second):
        assert summarise(encode(graph))["source"] == source_key(graph)


# -- signed entries ----------------------------------------------------------------------------


def _graph_entry(tmp_path):
    return stored_graph(cache_over(MemoryStore(), tmp_path, "off"))[0]


def _library(graph, key, secret=SECRET, library=b"\x7fELF library", isa="AVX2"):
    return fused_entry(key, graph, library=library, isa=isa, aliases=[],
                       restride=[[0, [2, 3], [3, 1]]], secret=secret,
                       stats={"compile_seconds": 1.0})


def test_a_signed_library_reads_back_and_any_tampering_is_refused(tmp_path):
    graph = _graph_entry(tmp_path)
    key = library_key(graph)
    good = _library(graph, key)
    assert library_of(good, SECRET, source_key(graph)).data == b"\x7fELF library"

    flipped = dict(good.payload, library=b"\x7fELF librarz")
    with pytest.raises(EntryError, match="do not match its recorded sha256"):
        library_of(good.__class__(**{**good.__dict__, "payload": flipped}), SECRET,
                   source_key(graph))
    flipped["library_sha256"] = hashlib.sha256(flipped["library"]).hexdigest()  # as planted
    with pytest.raises(EntryError, match="signature mismatch"):
        library_of(good.__class__(**{**good.__dict__, "payload": flipped}), SECRET,
                   source_key(graph))
    with pytest.raises(EntryError, match="signature mismatch"):
        library_of(_library(graph, key, secret=b"o" * 32), SECRET, source_key(graph))
    unsigned = {k: v for k, v in good.payload.items() if k != "hmac"}
    with pytest.raises(EntryError, match="unsigned"):
        library_of(good.__class__(**{**good.__dict__, "payload": unsigned}), SECRET,
                   source_key(graph))
    # A good library of another graph, under this graph's key: refused.
    with pytest.raises(EntryError, match="of graph"):
        library_of(good, SECRET, "c" * 64)
    assert library_of(refusal_entry(key, graph, "slower"), SECRET, source_key(graph)) is None


# -- a process that finds one ------------------------------------------------------------------


def _store(cache: GraphCache, entry) -> None:
    cache.store_entry(entry, CacheKey(entry.key, dict(entry.meta["key_parts"])))


def test_a_tampered_library_is_dropped_and_the_graph_replays(tmp_path, monkeypatch):
    store = MemoryStore()
    cache = cache_over(store, tmp_path, "off")
    graph, model, x = stored_graph(cache)
    good = _library(graph, library_key(graph))
    payload = dict(good.payload, library=b"\x7fELF tampered",
                   library_sha256=hashlib.sha256(b"\x7fELF tampered").hexdigest())
    _store(cache, good.__class__(**{**good.__dict__, "payload": payload}))
    monkeypatch.setattr(tier, "load_runner", lambda data: pytest.fail("loaded a bad library"))
    warm = cache_over(store, tmp_path, "background")
    monkeypatch.setattr(tier, "start_worker", lambda directory: None)
    with pytest.warns(RuntimeWarning, match="signature mismatch.*compiled again"):
        compiled = warm.extract_compiled_graph(fx.symbolic_trace(model), [x])
    torch.testing.assert_close(compiled(x)[0], model(x))
    assert store.get(library_key(graph).digest) is None  # dropped


def test_a_library_moved_under_another_graphs_key_is_dropped_unloaded(tmp_path, monkeypatch):
    store = MemoryStore()
    cache = cache_over(store, tmp_path, "off")
    graph, model, x = stored_graph(cache)
    other = cache.extract_compiled_graph(fx.symbolic_trace(nn.Sequential(Small(), nn.Tanh())),
                                         [x]).entry
    _store(cache, _library(other, library_key(other)))
    store.put(library_key(graph).digest, store.get(library_key(other).digest))
    monkeypatch.setattr(tier, "load_runner", lambda data: pytest.fail("loaded another's library"))
    monkeypatch.setattr(tier, "start_worker", lambda directory: None)
    with pytest.warns(RuntimeWarning, match=f"stored under {library_key(graph).digest[:12]}"):
        compiled = cache_over(store, tmp_path, "background").extract_compiled_graph(
            fx.symbolic_trace(model), [x])
    torch.testing.assert_close(compiled(x)[0], model(x))
    assert store.get(library_key(graph).digest) is None


def _as_cpu(monkeypatch, features) -> None:
    """This process as a CPU of ``features``, uncapped (whatever
    ATEN_CPU_CAPABILITY the tests run under)."""
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.setattr(cpu_isa, "_probed", lambda: frozenset(features))


def test_a_library_for_features_this_cpu_lacks_is_kept_never_loaded_never_rebuilt(
        tmp_path, monkeypatch):
    """Found where the CPU lacks a feature it needs (a directory copied from
    another machine), a library is a miss here: never loaded, never queued
    or compiled again, and kept for the CPUs it was built for. One warning
    a process names what is missing."""
    store = MemoryStore()
    cache = cache_over(store, tmp_path, "off")
    graph, model, x = stored_graph(cache)
    _as_cpu(monkeypatch, {"avx2"})
    key = library_key(graph)
    _store(cache, _library(graph, key, isa="AVX512 AVX512_VNNI AMX_TILE"))
    monkeypatch.setattr(tier, "load_runner", lambda data: pytest.fail("loaded an AMX library"))
    monkeypatch.setattr("ltc_cache.graph.fused.build.build_entry",
                        lambda *a: pytest.fail("compiled it again"))
    monkeypatch.setattr(tier, "start_worker", lambda directory: pytest.fail("queued it"))
    for mode in ("sync", "background"):
        counters.reset()  # a new process
        with pytest.warns(RuntimeWarning, match="this CPU lacks AVX512 AVX512_VNNI AMX_TILE"):
            compiled = cache_over(store, tmp_path, mode).extract_compiled_graph(
                fx.symbolic_trace(model), [x])
        torch.testing.assert_close(compiled(x)[0], model(x))
        assert not any(v for k, v in counters.snapshot().items() if k.startswith("fused"))
    assert "library" in cache.lookup_entry(key, count=False).payload


def test_an_isa_ltc_cache_does_not_know_is_refused_by_name(tmp_path, monkeypatch):
    store = MemoryStore()
    cache = cache_over(store, tmp_path, "off")
    graph, model, x = stored_graph(cache)
    _store(cache, _library(graph, library_key(graph), isa="AVX2 AVX10_2"))
    monkeypatch.setattr(tier, "load_runner", lambda data: pytest.fail("guessed at AVX10_2"))
    with pytest.warns(RuntimeWarning, match="whose AVX10_2 ltc_cache does not know"):
        compiled = cache_over(store, tmp_path, "sync").extract_compiled_graph(
            fx.symbolic_trace(model), [x])
    torch.testing.assert_close(compiled(x)[0], model(x))


def test_a_mixed_fleet_compiles_once_per_cpu_kind(tmp_path, monkeypatch):
    """Two kinds of CPU alternating over one store (an AVX2 and an AMX
    machine over one Redis, say), the compile simulated: each kind
    compiles its library once and loads it after, and neither replaces or
    rebuilds the other's."""
    store = MemoryStore()
    graph, model, x = stored_graph(cache_over(store, tmp_path, "off"))
    builds = []

    def build(graph_entry, key, secret):
        builds.append(cpu_isa.machine_isa())
        return _library(graph_entry, key, isa=cpu_isa.machine_isa())

    monkeypatch.setattr("ltc_cache.graph.fused.build.build_entry", build)
    made = _fake_library(monkeypatch, graph)
    kinds = [CPU_KINDS["Zen 2 (AVX2)"], CPU_KINDS["Sapphire Rapids (AMX)"]] * 3
    for features in kinds:
        _as_cpu(monkeypatch, features)
        compiled = cache_over(store, tmp_path, "sync").extract_compiled_graph(
            fx.symbolic_trace(model), [x])
        torch.testing.assert_close(compiled(x)[0], model(x))
        assert isinstance(compiled._fn, FusedFunction)
    assert builds == ["AVX2", "AVX512 AVX512_VNNI AVX512_BF16 AMX_TILE"]
    assert len(made) == len(kinds)


def test_a_refusal_keeps_torchscript_without_compiling(tmp_path, monkeypatch):
    store = MemoryStore()
    cache = cache_over(store, tmp_path, "off")
    graph, model, x = stored_graph(cache)
    _store(cache, refusal_entry(library_key(graph), graph, "not faster"))
    monkeypatch.setattr("ltc_cache.graph.fused.build.build_entry",
                        lambda *a: pytest.fail("compiled a refused graph"))
    compiled = cache_over(store, tmp_path, "sync").extract_compiled_graph(
        fx.symbolic_trace(model), [x])
    assert not isinstance(compiled._fn, FusedFunction)
    torch.testing.assert_close(compiled(x)[0], model(x))


def test_without_a_compiler_the_graph_is_refused_once_and_replays(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no g++
    monkeypatch.delenv("CXX", raising=False)
    platform.compiler_id.cache_clear()
    try:
        store = MemoryStore()
        cache = cache_over(store, tmp_path, "sync")
        with pytest.warns(RuntimeWarning, match="no fused library for .*no C.. compiler"):
            graph, model, x = stored_graph(cache)
        fused = cache.lookup_entry(library_key(graph), count=False)
        assert fused is not None and "no C++ compiler" in fused.payload["reason"]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once a process
            compiled = cache_over(store, tmp_path, "sync").extract_compiled_graph(
                fx.symbolic_trace(model), [x])
        torch.testing.assert_close(compiled(x)[0], model(x))
    finally:
        platform.compiler_id.cache_clear()


def test_a_miss_starts_the_worker_before_its_graph_is_queued_once(tmp_path, monkeypatch):
    """The worker is started at the miss, with nothing queued yet (its
    compile gets ready while the graph is traced), and not again while it
    runs; once it has left, the next graph queued starts it again."""
    started = []
    monkeypatch.setattr(tier, "start_worker", lambda directory: started.append(
        (directory, tier.FuseQueue(directory).pending())))
    (tmp_path / "ltc").mkdir()
    queue = tier.FuseQueue(tmp_path / "ltc")
    cache = cache_over(MemoryStore(), tmp_path, "background")
    with queue.worker_lock() as held:  # the worker, running
        assert held
        graph = stored_graph(cache)[0]
        stored_graph(cache)  # the same graph again: looked up once a process
    assert started == [(tmp_path / "ltc", [])]
    assert queue.pending() == [graph.key]
    cache.fused.queue("0" * 64)  # the worker has left
    assert len(started) == 2


def test_the_entry_records_its_inputs_layouts(tmp_path):
    graph = _graph_entry(tmp_path)
    specs = {(s.kind, s.ref): spec for s, spec in zip(graph.inputs, graph.meta["input_specs"],
                                                       strict=True)}
    assert specs[("attr", "linear.weight")] == ["float32", [3, 4], [4, 1]]
    assert specs[("arg", 0)] == ["float32", [2, 4], [4, 1]]


class TwoMasks(nn.Module):
    """Two masks built in the graph from ``arange``: constants of one shape."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.device
        a = torch.arange(8, device=d).unsqueeze(1) >= torch.arange(8, device=d).unsqueeze(0)
        b = torch.arange(1, 9, device=d).unsqueeze(1) > torch.arange(8, device=d).unsqueeze(0)
        return x.masked_fill(a.expand(2, 8, 8), 0.0) + x.masked_fill(b.expand(2, 8, 8), 1.0)


def _two_masks_entry(tmp_path):
    cache = GraphCache(CacheConfig(directory=tmp_path, fuse="off"))
    return cache.extract_compiled_graph(fx.symbolic_trace(TwoMasks()),
                                        [torch.randn(2, 8, 8)]).entry


def test_a_graph_with_constant_masks_is_traced_for_its_library(tmp_path):
    """TorchScript's optimizing executor would fold both masks into
    constants and compare them (aten.equal), which fake tensors cannot
    answer: the build traces the graph as a replay runs it, unoptimized."""
    from ltc_cache.graph.fused import build
    from ltc_cache.graph.fused.aten_graph import aten_graph

    entry = _two_masks_entry(tmp_path)
    inputs = build.example_inputs(entry)
    traced = aten_graph(build_function(entry.ir), inputs)
    x = next(t for source, t in zip(entry.inputs, inputs, strict=True) if source.kind == "arg")
    torch.testing.assert_close(traced(*inputs)[0], TwoMasks()(x))


@pytest.mark.parametrize("exports_call_scripts", [True, False], ids=["one call", "aten graph"])
def test_a_library_is_compiled_from_one_call_or_the_aten_graph_where_export_cannot_call_scripts(
        tmp_path, monkeypatch, exports_call_scripts):
    """Where this torch's export can call a TorchScript function, the
    compile is given a graph of one call of it, LTC's view copies among its
    decompositions (one trace: the export's); where not, the aten graph
    make_fx traces, Inductor's decompositions alone. Both compute what the
    entry's function computes."""
    from ltc_cache.graph.fused import build

    entry = _two_masks_entry(tmp_path)
    given = []

    def compile_library(graph, inputs, settings, decompositions=None):
        given.append((graph, decompositions))
        raise build.FuseFailed("compiled no further")

    monkeypatch.setattr(build, "compile_library", compile_library)
    monkeypatch.setattr(build, "exports_call_scripts", lambda: exports_call_scripts)
    refused = build.build_entry(entry, library_key(entry), SECRET)
    assert refused.payload["reason"] == "compiled no further"
    ((graph, decompositions),) = given
    calls = [n.target for n in graph.graph.nodes if n.op == "call_function"
             and n.target.__name__ != "getitem"]
    if exports_call_scripts:
        assert len(calls) == 1 and torch.ops.aten.slice_copy.Tensor in decompositions
    else:
        assert len(calls) > 1 and decompositions is None
        assert all(isinstance(t, torch._ops.OpOverload) for t in calls), calls
    inputs = build.example_inputs(entry)
    x = next(t for source, t in zip(entry.inputs, inputs, strict=True) if source.kind == "arg")
    torch.testing.assert_close(graph(*inputs)[0], TwoMasks()(x))


def test_where_the_export_cannot_trace_the_call_the_aten_graph_is_compiled(tmp_path,
                                                                             monkeypatch):
    """A call the export's trace fails in (as T5's training forward's
    does: a view of a tensor its fake regions laid out otherwise) is
    compiled from the aten graph make_fx traces; a failure past the call
    (the compile) refuses the library at once."""
    from ltc_cache.graph.fused import build

    entry = _two_masks_entry(tmp_path)
    given = []

    def compile_library(graph, inputs, settings, decompositions=None):
        given.append(decompositions)
        if decompositions is not None:  # the graph of one call: its call fails
            graph(*[torch.randn(3) for _ in inputs])
        raise build.FuseFailed("compiled no further")

    monkeypatch.setattr(build, "compile_library", compile_library)
    refused = build.build_entry(entry, library_key(entry), SECRET)
    assert refused.payload["reason"] == "compiled no further"
    assert len(given) == 2 and given[0] is not None and given[1] is None


# -- a library's calls -------------------------------------------------------------------------


class FakeRunner:
    """Stands in for the C++ runner: computes what the graph would."""

    def __init__(self, fn) -> None:
        self.fn, self.calls = fn, 0

    def run(self, inputs):
        self.calls += 1
        return list(self.fn(*inputs))


def script(x, w):
    return (x @ w, x.t(), (x @ w).t())


def test_a_library_gives_views_and_layouts_as_torchscript_did():
    x, w = torch.randn(3, 4), torch.randn(4, 2)
    fake = FakeRunner(lambda x, w: ((x @ w), x.t().contiguous(), (x @ w).t().contiguous()))
    verdicts = []
    fused = FusedFunction(fake, script, aliases=[[1, "in", 0, [4, 3], [1, 4], 0]],
                          restride=[[2, [2, 3], [1, 2]]],
                          check=lambda e, g, err: verdicts.append(mismatch(e, g)) or True)
    first = fused(x, w)
    assert verdicts == [None] and fake.calls == 1
    out = fused(x, w)
    assert fake.calls == 2
    assert out[1].data_ptr() == x.data_ptr() and out[1].stride() == (1, 4)  # a view again
    assert out[2].stride() == (1, 2)  # laid out as TorchScript's
    for a, b in zip(out, first, strict=True):
        torch.testing.assert_close(a, b)


def test_a_library_that_differs_on_its_first_call_is_never_used_again():
    x, w = torch.randn(3, 4), torch.randn(4, 2)
    fake = FakeRunner(lambda x, w: (x @ w + 1e-3, x.t(), (x @ w).t()))
    problems = []
    fused = FusedFunction(fake, script, aliases=[], restride=[],
                          check=lambda e, g, err: problems.append(mismatch(e, g)) and False)
    for _ in range(3):
        torch.testing.assert_close(fused(x, w)[0], x @ w)
    assert fake.calls == 1 and "output 0: differs" in problems[0] and not fused.in_use


def test_slices_of_one_hidden_tensor_become_outputs_of_their_own_unless_they_overlap():
    """A forward's saved query and key, slices of one projection no output
    returns whole: nothing can tell fresh tensors from those views, so the
    library returns its own. Views of an input or of a whole output stay
    views; overlapping slices cannot be told apart from views, so refused."""
    from ltc_cache.errors import FuseFailed
    from ltc_cache.graph.fused.build import output_aliases

    x = torch.randn(2, 3, 12)
    qkv = x * 2
    q, k, v = qkv.split(4, dim=-1)
    whole = x + 1
    assert output_aliases([q, k, v.transpose(1, 2)], [x]) == []
    assert output_aliases([whole, whole[0], q], [x]) == [[1, "out", 0, [3, 12], [12, 1], 0]]
    assert output_aliases([x[1]], [x]) == [[0, "in", 0, [3, 12], [12, 1], 36]]
    with pytest.raises(FuseFailed, match="overlap"):
        output_aliases([qkv[..., :8], qkv[..., 4:]], [x])
    with pytest.raises(FuseFailed, match="overlap"):
        output_aliases([qkv[:, :1].expand(2, 3, 12), qkv[:, 2]], [x])


def running_mean(stats, x):
    """Writes its input as BatchNorm's statistics do: twice is not once."""
    stats.mul_(0.5).add_(x.mean(0))
    return (x - stats,)


@pytest.mark.parametrize("library_writes", [0.5, 0.25])
def test_a_library_that_writes_its_inputs_is_compared_without_writing_twice(library_writes):
    """The first call compares outputs and writes with the inputs put back
    between the two runs; the inputs end as TorchScript wrote them, once,
    whatever the verdict. A library that writes other values is refused."""
    x = torch.randn(5, 3)
    stats, expected = torch.ones(3), torch.ones(3)
    fake = FakeRunner(lambda s, x: (x - (s * 0.5 + x.mean(0)),  # running_mean's output
                                    s.mul_(library_writes).add_(x.mean(0)))[:1])
    problems = []
    fused = FusedFunction(fake, running_mean, aliases=[], restride=[], writes=[0],
                          check=lambda e, g, err: problems.append(mismatch(e, g)) is None
                          and problems[-1] is None)
    for _ in range(3):
        torch.testing.assert_close(fused(stats, x)[0], running_mean(expected, x)[0])
        torch.testing.assert_close(stats, expected)
    if library_writes == 0.5:
        assert problems == [None] and fused.in_use and fake.calls == 3
    else:  # same output on the first call, other writes
        assert fake.calls == 1 and "output 1: differs" in problems[0] and not fused.in_use


def test_autograd_gets_torchscript_where_it_would_record():
    w = torch.randn(4, 2, requires_grad=True)
    fake = FakeRunner(script)
    fused = FusedFunction(fake, script, aliases=[], restride=[], check=lambda e, g, err: True)
    out = fused(torch.randn(3, 4), w)
    assert out[0].requires_grad and fake.calls == 0
    with torch.no_grad():
        fused(torch.randn(3, 4), w)
    assert fake.calls == 1


def test_mismatch_tolerates_reordered_sums_and_nothing_more():
    a = torch.tensor([1.0, -2.0, float("nan"), 4.0])
    assert mismatch([a], [a + 1e-6 * torch.tensor([1, 0, 0, 0])]) is None
    assert "differs by" in mismatch([a], [a + 1e-3])
    assert "NaN" in mismatch([a], [a.nan_to_num()])
    assert "values differ" in mismatch([torch.arange(3)], [torch.arange(3) + 1])
    assert "strides" in mismatch([torch.ones(2, 3)], [torch.ones(3, 2).t()])
    assert mismatch([torch.ones(2)], None, error=RuntimeError("boom")).endswith("boom)")
    # An output near zero is held to float32's rounding at unit scale, not to
    # 1e-5 of its own largest value; above that rounding it still differs.
    tiny = torch.tensor([3e-9, -1e-9])
    assert mismatch([tiny], [tiny + 5e-8]) is None
    assert "differs by" in mismatch([tiny], [tiny + 1e-6])


def test_a_bad_fuse_setting_warns_and_keeps_the_default():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = CacheConfig.from_env({"LTC_CACHE_FUSE": "always", "LTC_CACHE_DIR": "/tmp/x"})
    assert config.fuse == "background" and "LTC_CACHE_FUSE" in str(caught[0].message)
    assert CacheConfig.from_env({"LTC_CACHE_FUSE": "OFF", "LTC_CACHE_DIR": "/x"}).fuse == "off"


# -- a library picked up by the process that queued its graph ---------------------------------


def _fake_library(monkeypatch, graph, compute=None) -> list:
    """Loading a stored library gives a FakeRunner computing what the
    graph's TorchScript function does (or ``compute`` of its results); the
    runners made, in order."""
    script_fn = build_function(graph.ir)
    made = []

    def load(data):
        assert data == b"\x7fELF library"
        fake = FakeRunner(lambda *inputs: (compute or (lambda out: out))(script_fn(*inputs)))
        made.append(fake)
        return fake

    monkeypatch.setattr(tier, "load_runner", load)
    return made


def test_a_queued_graph_switches_to_its_library_once_the_worker_is_done(tmp_path, monkeypatch):
    """The replay runs TorchScript while the graph's file is in the queue,
    and the library (loaded and compared on its first call) from the first
    look after the worker took it off, in the same process."""
    monkeypatch.setattr(tier, "start_worker", lambda directory: None)
    monkeypatch.setattr(pickup, "LOOK_SECONDS", 0.05)
    (tmp_path / "ltc").mkdir()
    store = MemoryStore()
    cache = cache_over(store, tmp_path, "background")
    graph, model, x = stored_graph(cache)
    compiled = cache.extract_compiled_graph(fx.symbolic_trace(model), [x])
    pending = compiled._fn
    assert isinstance(pending, PendingFunction) and pending.waiting
    made = _fake_library(monkeypatch, graph)
    queue = tier.FuseQueue(tmp_path / "ltc")
    with torch.no_grad():
        _store(cache, _library(graph, library_key(graph), isa=""))  # stored, still queued
        time.sleep(0.06)
        compiled(x)
        assert not made and pending.waiting  # the worker has not taken it off yet
        queue.done(graph.key)  # as the worker does, once the entry is stored
        time.sleep(0.06)
        torch.testing.assert_close(compiled(x)[0], model(x))
        assert isinstance(pending.function, FusedFunction) and not pending.waiting
        assert made[0].calls == 1  # the first call: library and TorchScript, compared
        torch.testing.assert_close(compiled(x)[0], model(x))
        assert made[0].calls == 2
    stats = ltc_cache.stats()
    assert stats["fused_pickups"] == 1 and stats["fused_loads"] == 1
    assert stats["fused_checks"] == 1
    # A later binding of the graph in this process gets the library itself.
    again = cache.extract_compiled_graph(fx.symbolic_trace(model), [x])
    assert again._fn is pending.function


def test_a_graph_refused_by_the_worker_stays_on_torchscript(tmp_path, monkeypatch):
    monkeypatch.setattr(tier, "start_worker", lambda directory: None)
    monkeypatch.setattr(pickup, "LOOK_SECONDS", 0.0)
    (tmp_path / "ltc").mkdir()
    cache = cache_over(MemoryStore(), tmp_path, "background")
    graph, model, x = stored_graph(cache)
    compiled = cache.extract_compiled_graph(fx.symbolic_trace(model), [x])
    _store(cache, refusal_entry(library_key(graph), graph, "not faster: 2 ms against 1"))
    tier.FuseQueue(tmp_path / "ltc").done(graph.key)
    monkeypatch.setattr(tier, "load_runner", lambda data: pytest.fail("loaded a refusal"))
    torch.testing.assert_close(compiled(x)[0], model(x))
    assert not compiled._fn.waiting and not isinstance(compiled._fn.function, FusedFunction)
    assert "fused_pickups" not in ltc_cache.stats()


@pytest.mark.parametrize("setting", ["readonly", "off"])
def test_no_pickup_in_a_read_only_cache_or_without_the_tier(tmp_path, monkeypatch, setting):
    monkeypatch.setattr(tier, "start_worker", lambda directory: pytest.fail("started a worker"))
    store = MemoryStore()
    _, model, x = stored_graph(cache_over(store, tmp_path, "off"))
    config = CacheConfig(directory=tmp_path / "ltc", secret=SECRET,
                         fuse="off" if setting == "off" else "background",
                         readonly=setting == "readonly")
    compiled = GraphCache(config, store=store).extract_compiled_graph(
        fx.symbolic_trace(model), [x])
    assert not isinstance(compiled._fn, PendingFunction | FusedFunction)
    assert not (tmp_path / "ltc" / "fuse-queue").exists()


def test_many_threads_on_a_pending_graph_load_its_library_once(tmp_path):
    """Eight threads calling while the file goes: one looks and resolves,
    every call returns what the graph computes."""
    queued = tmp_path / "queued"
    queued.touch()
    resolved, results = [], []
    gate = threading.Event()

    def resolve():
        resolved.append(threading.get_ident())
        gate.wait(1)  # a slow load: the other threads run on TorchScript meanwhile
        return lambda n: ("library", n)

    pending = PendingFunction(lambda n: ("script", n), str(queued), resolve, every=0.0)

    def caller(n: int) -> None:
        for i in range(200):
            results.append(pending(n * 1000 + i))
            if n == 0 and i == 50:
                queued.unlink()
            if i == 150:
                gate.set()

    threads = [threading.Thread(target=caller, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(resolved) == 1 and len(results) == 1600
    assert {kind for kind, _ in results} == {"script", "library"}
    assert pending(7) == ("library", 7) and not pending.waiting


# -- checked once: a verdict kept for later processes -------------------------------------------


def _library_process(store, tmp_path, monkeypatch, graph, model, x, *, compute=None):
    """A process that finds the stored library: its compiled graph after
    one call (no grad) and the fake runner it loaded."""
    made = _fake_library(monkeypatch, graph, compute)
    compiled = cache_over(store, tmp_path, "background").extract_compiled_graph(
        fx.symbolic_trace(model), [x])
    with torch.no_grad():
        torch.testing.assert_close(compiled(x)[0], model(x))
    return compiled, made[0]


def _verdict_ready(tmp_path, monkeypatch):
    """A stored graph and its (fake) library, whose first call matched in
    one process: the store, the graph, its model and input."""
    store = MemoryStore()
    graph, model, x = stored_graph(cache_over(store, tmp_path, "off"))
    _store(cache_over(store, tmp_path, "off"), _library(graph, library_key(graph), isa=""))
    _, fake = _library_process(store, tmp_path, monkeypatch, graph, model, x)
    assert fake.calls == 1 and ltc_cache.stats()["fused_checks"] == 1
    return store, graph, model, x


def test_a_library_checked_once_runs_alone_in_the_next_process(tmp_path, monkeypatch):
    store, graph, model, x = _verdict_ready(tmp_path, monkeypatch)
    record = store.get(verdicts.verdict_key(library_key(graph).digest))
    assert record is not None and len(record) < 1000  # a small record, not a library's copy
    counters.reset()  # the next process
    compiled, fake = _library_process(store, tmp_path, monkeypatch, graph, model, x)
    assert compiled._fn.checked and fake.calls == 1  # the library ran the first call
    assert "fused_checks" not in ltc_cache.stats() and ltc_cache.stats()["fused_loads"] == 1


def _replace_record(store, graph, **changes) -> None:
    key = verdicts.verdict_key(library_key(graph).digest)
    record = read_record(store.get(key), verdicts.CHECKED_FORMAT)
    store.put(key, write_record(verdicts.CHECKED_FORMAT, {**record, **changes}))


@pytest.mark.parametrize("forgery", ["other key", "tampered", "another library", "garbage"])
def test_a_forged_or_foreign_verdict_is_ignored_and_the_check_runs(tmp_path, monkeypatch,
                                                                   forgery):
    store, graph, model, x = _verdict_ready(tmp_path, monkeypatch)
    fused = library_key(graph).digest
    if forgery == "other key":  # a verdict signed by someone without the program key
        verdicts.store_verdict(store, fused, source_key(graph),
                               _library(graph, library_key(graph)).payload["hmac"], b"o" * 32)
    elif forgery == "tampered":
        record = read_record(store.get(verdicts.verdict_key(fused)),
                                            verdicts.CHECKED_FORMAT)
        _replace_record(store, graph, hmac=bytes(b ^ 1 for b in record["hmac"]))
    elif forgery == "another library":  # signed with the key, for another library
        verdicts.store_verdict(store, fused, source_key(graph), _library(
            graph, library_key(graph), library=b"\x7fELF other").payload["hmac"], SECRET)
    else:
        store.put(verdicts.verdict_key(fused), b"\xc1 not msgpack")
    counters.reset()
    compiled, fake = _library_process(store, tmp_path, monkeypatch, graph, model, x)
    assert ltc_cache.stats()["fused_checks"] == 1 and compiled._fn.in_use and fake.calls == 1
    # ... and a good verdict is stored over it.
    counters.reset()
    compiled, _ = _library_process(store, tmp_path, monkeypatch, graph, model, x)
    assert compiled._fn.checked and "fused_checks" not in ltc_cache.stats()


def test_a_library_that_differs_is_refused_and_no_verdict_kept(tmp_path, monkeypatch):
    store = MemoryStore()
    graph, model, x = stored_graph(cache_over(store, tmp_path, "off"))
    _store(cache_over(store, tmp_path, "off"), _library(graph, library_key(graph), isa=""))
    with pytest.warns(RuntimeWarning, match="is not used: output 0: differs"):
        compiled, fake = _library_process(store, tmp_path, monkeypatch, graph, model, x,
                                          compute=lambda out: tuple(t + 1e-3 for t in out))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x)[0], model(x))
    assert not compiled._fn.in_use and fake.calls == 1
    assert ltc_cache.stats()["fused_refused"] == 1
    assert store.get(verdicts.verdict_key(library_key(graph).digest)) is None
    refusal = store.get(library_key(graph).digest)
    assert b"on first use" in refusal


def test_a_read_only_cache_checks_and_keeps_no_verdict(tmp_path, monkeypatch):
    store = MemoryStore()
    graph, model, x = stored_graph(cache_over(store, tmp_path, "off"))
    _store(cache_over(store, tmp_path, "off"), _library(graph, library_key(graph), isa=""))
    _fake_library(monkeypatch, graph)
    config = CacheConfig(directory=tmp_path / "ltc", secret=SECRET, readonly=True,
                         fuse="background")
    compiled = GraphCache(config, store=store).extract_compiled_graph(
        fx.symbolic_trace(model), [x])
    with torch.no_grad():
        compiled(x)
    assert compiled._fn.checked and ltc_cache.stats()["fused_checks"] == 1
    assert store.get(verdicts.verdict_key(library_key(graph).digest)) is None


def _spinning(calls: dict[str, int], side: str, seconds: float):
    """A function that takes ``seconds`` of CPU a call, counted in ``calls[side]``."""
    def call(*args):
        calls[side] += 1
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass
    return call


def test_the_timing_of_a_long_graph_takes_fewer_rounds(monkeypatch):
    """Both sides are timed in interleaved rounds, fewer where the rounds
    would take too long (a GPT-2 backward's call is seconds): at least
    three, each side's fastest compared; a call of seconds is timed once
    a side."""
    from ltc_cache.graph.fused import build

    calls = {"script": 0, "fused": 0}
    spin = functools.partial(_spinning, calls)

    inputs = [torch.zeros(1)]
    script, fused = spin("script", 0.02), spin("fused", 0.01)
    script_ms, fused_ms = build._time_both(script, fused, inputs, ())
    # A call as long as a round: the first calls are the first round.
    assert calls == {"script": build._ROUNDS, "fused": build._ROUNDS}
    assert fused_ms < script_ms
    monkeypatch.setattr(build, "_TIMING_SECONDS", 0.1)  # as a call of seconds would be
    calls.update(script=0, fused=0)
    build._time_both(script, fused, inputs, ())
    assert calls == {"script": build._MIN_ROUNDS, "fused": build._MIN_ROUNDS}
    monkeypatch.setattr(build, "_ONE_ROUND_SECONDS", 0.015)  # as a call of 5 s is
    calls.update(script=0, fused=0)
    script_ms, fused_ms = build._time_both(script, fused, inputs, ())
    assert calls == {"script": 1, "fused": 1} and fused_ms < script_ms
    # The build's own first calls, timed as the timing times them: no call more.
    calls.update(script=0, fused=0)
    assert build._time_both(script, fused, inputs, (), first=(20.0, 10.0)) == (20.0, 10.0)
    assert calls == {"script": 0, "fused": 0}
    # But a first call shorter than a round is mostly set-up: timed again.
    build._time_both(script, fused, inputs, (), first=(3.0, 1.0))
    assert calls == {"script": 1, "fused": 1}


@pytest.mark.parametrize(("fused_seconds", "timings"), [(0.0105, 2), (0.02, 1), (0.005, 1)])
def test_a_close_refusal_is_timed_again_and_nothing_else(fused_seconds, timings):
    """A library that misses the keep line by a close call is timed again,
    both sides (one timing on a shared machine refused a plan library it
    kept in the next run); one clearly slower or clearly faster is not."""
    from ltc_cache.graph.fused import build

    calls = {"script": 0, "fused": 0}
    spin = functools.partial(_spinning, calls)

    script, fused = spin("script", 0.01), spin("fused", fused_seconds)
    # The build's first calls (timed, as the timing's first round) are not made again.
    build._times_to_keep_by(0.97, script, fused, [torch.zeros(1)], (),
                            first=(10.0, 1e3 * fused_seconds))
    assert calls["script"] == calls["fused"] == timings * build._ROUNDS - 1
