"""Partitioning plans: AOTAutograd's inference graph stored as data, rebuilt
node for node, refused when it would not run bare, and replaced when bad."""

from __future__ import annotations

import dataclasses
import gc
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

import ltc_cache
from ltc_cache import CacheConfig, GraphCache, LtcBackend
from ltc_cache.compile_backend.decompose import decompositions
from ltc_cache.compile_backend.graph_wire import graph_from_wire, graph_to_wire
from ltc_cache.compile_backend.partition import partition
from ltc_cache.compile_backend.plan import partitioned_from_wire, partitioned_to_wire
from ltc_cache.compile_backend.support import OpSupport
from ltc_cache.entries.entry import Entry, decode, encode
from ltc_cache.entries.wire import is_entry_key
from ltc_cache.errors import EntryError
from ltc_cache.graph.graph_keys import compute_key, graph_digest

pytestmark = pytest.mark.usefixtures("dynamo_reset")


class Mixed(torch.nn.Module):
    """A tensor constant, a tuple-returning op read through getitem, keyword
    arguments with a dtype, a device and a memory format, and ``sign``,
    which LTC does not lower (so the graph is partitioned)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.fc(x)
        values, index = h.max(dim=-1)
        scale = torch.tensor([1.0, 2.0, 3.0, 4.0])
        ones = torch.ones(4, dtype=torch.float64, device=x.device)
        out = (torch.sign(h) * scale + h).clone(memory_format=torch.contiguous_format)
        return out.double() + ones, values + index


class MutatesInput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return torch.sign(x) + x.exp()


class ReturnsItsInput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.sign(x) + x.exp(), x.view(-1)


def inference_graph(model: torch.nn.Module, x: torch.Tensor):
    """AOTAutograd's inference graph of ``model`` as the backend receives
    it, and the flat inputs it takes."""
    captured = {}

    def compiler(gm, inputs):
        captured["graph"] = gm
        return make_boxed_func(gm.forward)

    def backend(gm, example_inputs):
        captured["inputs"] = list(example_inputs)
        return aot_autograd(fw_compiler=compiler, inference_compiler=compiler,
                            decompositions=decompositions())(gm, example_inputs)

    with torch.no_grad():
        torch.compile(model, backend=backend)(x)
    return captured["graph"], captured["inputs"]


def round_trip(wire: dict) -> dict:
    return msgpack.unpackb(msgpack.packb(wire, use_bin_type=True), raw=False)


def test_a_plan_rebuilds_the_graph_node_for_node():
    torch.manual_seed(0)
    gm, inputs = inference_graph(Mixed().eval(), torch.randn(3, 4))
    assert any(n.op == "get_attr" for n in gm.graph.nodes)  # the constant
    rebuilt = graph_from_wire(round_trip(graph_to_wire(gm)))

    # Same code, so the regions partitioned from it have the same keys.
    assert rebuilt.code == gm.code
    for old, new in zip(gm.graph.nodes, rebuilt.graph.nodes, strict=True):
        if isinstance(old.meta.get("val"), torch.Tensor):
            assert (new.meta["val"].dtype, new.meta["val"].shape, new.meta["val"].stride()) == \
                (old.meta["val"].dtype, old.meta["val"].shape, old.meta["val"].stride())
    with torch.no_grad():
        for got, want in zip(rebuilt(*inputs), gm(*inputs), strict=True):
            torch.testing.assert_close(got, want, atol=0, rtol=0)


def _corrupt(wire: dict, how: str) -> dict:
    nodes = wire["nodes"]
    call = next(n for n in nodes if n[0] == "call_function")
    if how == "unknown op":
        call[2] = "aten.no_such_op.default"
    elif how == "not an op":
        call[2] = "builtins.eval"
    elif how == "forward reference":
        call[3] = {"tuple": [{"node": nodes[-1][1]}]}
    elif how == "node kind":
        call[0] = "call_method"
    elif how == "dtype":
        call[5] = {"tensor": ["no_such_dtype", [3], [1]]}
    elif how == "constant bytes":
        next(iter(wire["constants"].values()))["data"] = b"\0"
    elif how == "argument":
        call[3] = {"tuple": [{"lambda": "x"}]}
    elif how == "format":
        wire["version"] = 0
    elif how == "output not last":
        nodes.append(nodes.pop(0))
    elif how == "keyword":
        call[4] = [["not a name", 1]]
    elif how == "attribute":
        nodes.insert(0, ["get_attr", "stray", "no_such_constant", {"tuple": []}, [], None])
    elif how == "layout":
        call[5] = {"tensor": ["float32", [3, 4], [1]]}
    elif how == "arguments":
        call[3] = [{"node": nodes[0][1]}]
    return wire


_CORRUPTIONS = ["unknown op", "not an op", "forward reference", "node kind", "dtype",
                "constant bytes", "argument", "format", "output not last", "keyword", "attribute",
                "layout", "arguments"]


@pytest.mark.parametrize("values", [True, False], ids=["with values", "run only"])
@pytest.mark.parametrize("how", _CORRUPTIONS)
def test_a_bad_plan_is_an_entry_error(how, values):
    gm, _ = inference_graph(Mixed().eval(), torch.randn(3, 4))
    with pytest.raises(EntryError):
        graph_from_wire(_corrupt(round_trip(graph_to_wire(gm)), how), values=values)


def test_a_plan_rebuilt_to_run_makes_no_values():
    """A warm start only runs a plan's parent graph: its nodes' recorded
    values (meta tensors) are checked, not made."""
    torch.manual_seed(0)
    gm, inputs = inference_graph(Mixed().eval(), torch.randn(3, 4))
    wire = round_trip(graph_to_wire(gm))
    assert any(node[5] is not None for node in wire["nodes"])
    rebuilt = graph_from_wire(wire, values=False)
    assert rebuilt.code == gm.code
    assert not any("val" in node.meta for node in rebuilt.graph.nodes)
    with torch.no_grad():
        for got, want in zip(rebuilt(*inputs), gm(*inputs), strict=True):
            torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.parametrize("how", _CORRUPTIONS)
def test_a_bad_stored_region_is_an_entry_error_at_load_not_when_built(how):
    """A stored region builds its graph only when first needed (a miss, an
    eager fallback: maybe inside a backward pass), so its entry is checked
    as fully when the plan loads
    (docs/torch/aot-autograd.md#stored-regions-built-only-when-needed)."""
    from ltc_cache.compile_backend.graph_wire import StoredRegion

    gm, _ = inference_graph(Mixed().eval(), torch.randn(3, 4))
    good = round_trip(graph_to_wire(gm))
    StoredRegion(good, "0" * 64).graph_module()
    with pytest.raises(EntryError):
        StoredRegion(_corrupt(round_trip(graph_to_wire(gm)), how), "0" * 64)


def compile_and_check(model: torch.nn.Module, x: torch.Tensor) -> dict[str, int]:
    """A fresh backend (as in a new process) against eager, arguments
    included; the counters it moved."""
    torch._dynamo.reset()
    before = ltc_cache.stats()
    eager_x, compiled_x = x.clone(), x.clone()
    with torch.no_grad():
        want = model(eager_x)
        got = torch.compile(model, backend=LtcBackend(GraphCache(CacheConfig.from_env())))(
            compiled_x)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(compiled_x, eager_x, atol=0, rtol=0)
    after = ltc_cache.stats()
    return {name: after.get(name, 0) - before.get(name, 0)
            for name in ("aot_graphs", "plan_hits", "traces", "errors")}


def plans(directory) -> list[tuple[str, Entry]]:
    store = GraphCache(CacheConfig.from_env()).store
    found = []
    for key in list(store.keys()):
        if is_entry_key(key):
            entry = decode(store.get(key), expected_key=key)
            if entry.kind == "plan":
                found.append((key, entry))
    return found


def test_a_warm_start_runs_the_plan_without_aot_autograd_or_partitioning(cache_dir,
                                                                          monkeypatch):
    torch.manual_seed(0)
    model, x = Mixed().eval(), torch.randn(3, 4)
    cold = compile_and_check(model, x)
    assert cold["aot_graphs"] == 1 and cold["plan_hits"] == 0
    [(_, entry)] = plans(cache_dir)
    assert len(entry.payload["plan"]["regions"]) >= 1  # stored partitioned

    import ltc_cache.compile_backend.partition

    def no_partitioning(*args, **kwargs):
        raise AssertionError("a warm start partitioned")

    monkeypatch.setattr(ltc_cache.compile_backend.partition, "partition", no_partitioning)
    warm = compile_and_check(model, x)
    assert warm == {"aot_graphs": 0, "plan_hits": 1, "traces": 0, "errors": 0}


def test_a_partitioned_plan_rebuilds_its_regions_node_for_node(cache_dir):
    """Parent and regions come back with the same code (so the regions have
    the keys the cold process stored them under) and compute the same."""
    torch.manual_seed(0)
    model, x = Mixed().eval(), torch.randn(3, 4)
    gm, inputs = inference_graph(model, x)
    with torch.no_grad():
        want = gm(*inputs)
    parted = partition(gm, OpSupport(GraphCache(CacheConfig.from_env()).store))
    assert parted.regions and parted.eager_ops  # Mixed has an op LTC does not lower
    rebuilt = partitioned_from_wire(round_trip(partitioned_to_wire(parted)))
    assert rebuilt.module.code == parted.module.code
    for name in parted.regions:
        region = rebuilt.module.get_submodule(name)
        assert region.graph_module().code == parted.module.get_submodule(name).code
    assert (rebuilt.regions, rebuilt.region_ops, rebuilt.total_ops, rebuilt.eager_ops) == \
        (parted.regions, parted.region_ops, parted.total_ops, parted.eager_ops)
    with torch.no_grad():
        for got, expected in zip(rebuilt.module(*inputs), want, strict=True):
            torch.testing.assert_close(got, expected, atol=0, rtol=0)


def test_a_loaded_plans_regions_generate_their_code_once_when_first_read(cache_dir):
    """Pins torch's private lazy GraphModule (torch.fx._lazy_graph_module):
    a region rebuilt from a plan generates no code until its key reads it,
    so the parent's recompile of its submodules does not generate it twice."""
    from torch.fx._lazy_graph_module import _LazyGraphModule

    from ltc_cache.fx_ops import lazy_module_class

    assert lazy_module_class() is _LazyGraphModule  # torch changed: see fx_ops.py
    model, x = Mixed().eval(), torch.randn(3, 4)
    gm, _ = inference_graph(model, x)
    parted = partition(gm, OpSupport(GraphCache(CacheConfig.from_env()).store))
    rebuilt = partitioned_from_wire(round_trip(partitioned_to_wire(parted)))
    region = rebuilt.module.get_submodule(parted.regions[0]).graph_module()
    assert isinstance(region, _LazyGraphModule) and type(region)._needs_recompile()
    assert region.code == parted.module.get_submodule(parted.regions[0]).code
    assert not type(region)._needs_recompile()


def test_a_plan_holds_its_regions_key_digests(cache_dir):
    """A loaded plan keys its regions by the digests it stored, which are
    what their code hashes to, and binds their constants: the same keys,
    and no region's graph built for them
    (docs/torch/aot-autograd.md#stored-regions-built-only-when-needed)."""
    from ltc_cache.compile_backend.graph_wire import StoredRegion
    from ltc_cache.graph.graph_keys import module_tensors

    model, x = Mixed().eval(), torch.randn(3, 4)
    gm, _ = inference_graph(model, x)
    parted = partition(gm, OpSupport(GraphCache(CacheConfig.from_env()).store))
    wire = round_trip(partitioned_to_wire(parted))
    rebuilt = partitioned_from_wire(wire)
    for name in parted.regions:
        original = parted.module.get_submodule(name)
        region = rebuilt.module.get_submodule(name)
        assert isinstance(region, StoredRegion) and region._built is None
        inputs = [torch.empty_strided(n.meta["val"].shape, n.meta["val"].stride())
                  for n in original.graph.find_nodes(op="placeholder")]
        stored = compute_key(region.graph_module, inputs, digest=region.digest,
                             tensors=region.constants)
        assert region._built is None  # keyed without its graph
        assert stored == compute_key(original, inputs)
        assert list(region.constants) == list(module_tensors(original))
        assert region.digest == graph_digest(original)


@pytest.mark.parametrize("how", ["region out of order", "call of a non-region", "op counts",
                                 "region without its digest"])
def test_a_bad_partitioned_plan_is_an_entry_error(cache_dir, how):
    gm, _ = inference_graph(Mixed().eval(), torch.randn(3, 4))
    parted = partition(gm, OpSupport(GraphCache(CacheConfig.from_env()).store))
    wire = round_trip(partitioned_to_wire(parted))
    if how == "region without its digest":
        wire["regions"][0] = wire["regions"][0][:3]
    elif how == "region out of order":
        wire["regions"][0][0] = "ltc_region_7"
    elif how == "call of a non-region":
        call = next(n for n in wire["graph"]["nodes"] if n[0] == "call_module")
        call[2] = "some_module"
    else:
        wire["eager_ops"] = {"aten.sin.default": "many"}
    with pytest.raises(EntryError):
        partitioned_from_wire(wire)


def test_a_corrupt_plan_is_replaced_and_the_model_still_runs(cache_dir):
    torch.manual_seed(0)
    model, x = Mixed().eval(), torch.randn(3, 4)
    compile_and_check(model, x)
    [(key, entry)] = plans(cache_dir)
    plan = entry.payload["plan"]
    payload = dict(entry.payload, plan=dict(plan, graph=dict(plan["graph"], nodes="junk")))
    GraphCache(CacheConfig.from_env()).store.put(
        key, encode(dataclasses.replace(entry, payload=payload)))

    with pytest.warns(RuntimeWarning, match="malformed graph"):
        again = compile_and_check(model, x)
    assert again["aot_graphs"] == 1 and again["plan_hits"] == 0 and again["errors"] == 1
    [(_, replaced)] = plans(cache_dir)
    partitioned_from_wire(replaced.payload["plan"])  # a good plan again
    assert compile_and_check(model, x)["plan_hits"] == 1


def test_no_plan_where_aot_autograd_wraps_the_graph(cache_dir):
    """AOTAutograd regenerates an output's alias of an input around such a
    graph; a bare plan would lose that, so none is stored, and every
    process runs AOTAutograd, with eager's results."""
    x = torch.randn(3, 4)
    for _ in range(2):
        assert compile_and_check(ReturnsItsInput(), x)["aot_graphs"] == 1
    assert plans(cache_dir) == []


class ReturnsItsUpdatedInput(torch.nn.Module):
    """A static key/value cache's update: written in place and returned."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x.index_copy_(0, torch.tensor([1]), torch.ones(1, 4))
        return x, torch.sign(x) + x.exp()


@pytest.mark.parametrize("model", [MutatesInput(), ReturnsItsUpdatedInput()],
                         ids=["mutates its input", "returns its updated input"])
def test_a_graph_that_updates_its_input_keeps_the_update_in_its_plan(cache_dir, model):
    """The update is the graph's own ``copy_`` (AOTAutograd's
    keep_inference_input_mutations), an eager op of the plan: the warm
    start runs no AOTAutograd, and the argument is updated as eager's is;
    an output that is the input is the input itself."""
    x = torch.randn(3, 4)
    assert compile_and_check(model, x)["aot_graphs"] == 1
    [(_, entry)] = plans(cache_dir)
    assert "aten.copy_.default" in entry.payload["plan"]["eager_ops"]
    warm = compile_and_check(model, x)
    assert warm["aot_graphs"] == 0 and warm["plan_hits"] == 1 and warm["traces"] == 0
    if isinstance(model, ReturnsItsUpdatedInput):
        torch._dynamo.reset()
        y = x.clone()
        with torch.no_grad():
            out, _ = torch.compile(model, backend=LtcBackend(GraphCache(CacheConfig.from_env())))(y)
        assert out is y


@pytest.mark.slow  # the CLI in processes that import torch
def test_verify_checks_a_plans_graph(cache_dir):
    """``ltc-cache show`` sums a plan up; ``ltc-cache verify`` rebuilds each
    plan's graph: a plan that passes its checksum but names an operator this
    torch lacks is reported."""
    torch.manual_seed(0)
    compile_and_check(Mixed().eval(), torch.randn(3, 4))
    script = Path(sys.executable).with_name("ltc-cache")
    good = subprocess.run([str(script), "--dir", str(cache_dir), "verify"],
                          capture_output=True, text=True, timeout=300)
    assert good.returncode == 0, good.stdout + good.stderr

    [(key, entry)] = plans(cache_dir)
    shown = subprocess.run([str(script), "--dir", str(cache_dir), "show", key[:12]],
                           capture_output=True, text=True, timeout=300)
    # A summary of the graph, not a dump of its nodes.
    plan = entry.payload["plan"]
    nodes = len(plan["graph"]["nodes"]) + sum(len(r[1]["nodes"]) for r in plan["regions"])
    assert "Plan " in shown.stdout
    assert f"{nodes} nodes in {len(plan['regions'])} LTC regions" in shown.stdout
    assert "placeholder" not in shown.stdout

    region = plan["regions"][0][1]
    call = next(n for n in region["nodes"] if n[0] == "call_function")
    call[2] = "aten.no_such_op.default"
    store = GraphCache(CacheConfig.from_env()).store
    store.put(key, encode(dataclasses.replace(entry, payload=dict(entry.payload, plan=plan))))
    store.close()
    bad = subprocess.run([str(script), "--dir", str(cache_dir), "verify"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1
    assert key[:12] in bad.stdout and "no_such_op" in bad.stdout


def test_a_read_only_cache_serves_its_plan_and_writes_nothing(cache_dir, monkeypatch):
    torch.manual_seed(0)
    model, x = Mixed().eval(), torch.randn(3, 4)
    compile_and_check(model, x)
    torch._dynamo.reset()
    gc.collect()  # the writing process is gone, as a read-only server would find it
    before = _stored_bytes(cache_dir)

    monkeypatch.setenv("LTC_CACHE_READONLY", "1")
    warm = compile_and_check(model, x)
    assert warm == {"aot_graphs": 0, "plan_hits": 1, "traces": 0, "errors": 0}
    assert _stored_bytes(cache_dir) == before


def _stored_bytes(directory: Path) -> dict[Path, bytes]:
    """Every file's bytes but SQLite's WAL index (``-shm``), shared memory
    in which every reader, read-only ones included, marks what it reads."""
    return {p: p.read_bytes() for p in directory.rglob("*")
            if p.is_file() and not p.name.endswith("-shm")}


def test_the_plan_key_follows_the_partitioners_code_and_constants(monkeypatch):
    """A plan is keyed by what makes it: a changed partitioning rule or
    constant (read by name, so not in any function's bytecode) makes a new
    key, rather than serving plans made by the old one."""
    import ltc_cache.compile_backend.partition
    import ltc_cache.compile_backend.plan
    from ltc_cache.entries.keys import key_from_parts

    base = key_from_parts({"graph": "0" * 64})

    def key() -> str:
        ltc_cache.compile_backend.plan._deciding_code.cache_clear()
        return ltc_cache.compile_backend.plan.plan_key(base).digest

    before = key()
    plan = ltc_cache.compile_backend.plan
    assert key() == before and plan.plan_key(base, training=True).digest != before
    monkeypatch.setattr(ltc_cache.compile_backend.partition, "_MIN_VIEW_ELEMENTS",
                        ltc_cache.compile_backend.partition._MIN_VIEW_ELEMENTS * 2)
    assert key() != before
    monkeypatch.undo()
    assert key() == before


class PoolsItsOutput(torch.nn.Module):
    """DINOv2's outputs: the last hidden state and, as a view of it, the
    first token of each row (``OutputType.alias_of_intermediate_base_is_user_output``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = torch.nn.functional.layer_norm(self.fc(x), (8,))
        return hidden, hidden[:, 0, :]


def test_a_training_output_that_views_another_is_stored_in_the_plan(cache_dir):
    """AOTAutograd's wrapper takes such an output again as a view of its
    base; the plan's does too, so the warm start runs no AOTAutograd, its
    gradients reach the weights through the view, and the view aliases its
    base as in eager."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8)
    deltas = []
    for _ in range(2):  # cold, then from the plan (a fresh backend, as in a new process)
        torch._dynamo.reset()
        model, eager = PoolsItsOutput(), PoolsItsOutput()
        eager.load_state_dict(model.state_dict())
        before = ltc_cache.stats()
        compiled = torch.compile(model, backend=LtcBackend(GraphCache(CacheConfig.from_env())))
        (hidden, pooled), (want_hidden, want_pooled) = compiled(x), eager(x)
        assert pooled._base is (hidden._base if hidden._base is not None else hidden)
        (hidden.pow(2).mean() + pooled.sum()).backward()
        (want_hidden.pow(2).mean() + want_pooled.sum()).backward()
        torch.testing.assert_close(pooled, want_pooled, atol=1e-6, rtol=1e-6)
        for got, want in zip(model.parameters(), eager.parameters(), strict=True):
            torch.testing.assert_close(got.grad, want.grad, atol=1e-6, rtol=1e-6)
        after = ltc_cache.stats()
        deltas.append({name: after.get(name, 0) - before.get(name, 0)
                       for name in ("aot_traces", "plan_hits", "errors")})
    assert deltas == [{"aot_traces": 1, "plan_hits": 0, "errors": 0},
                      {"aot_traces": 0, "plan_hits": 1, "errors": 0}], deltas
    [(_, entry)] = plans(cache_dir)
    assert entry.payload["joint"]["aliases"][0][:2] == [1, 0]


def test_a_training_graph_whose_backward_never_ran_still_stores_its_plan(cache_dir):
    """A step whose loss reaches none of a graph's outputs never runs that
    graph's backward, which AOTAutograd compiles lazily (one of Longformer's
    graphs): its plan is stored all the same (the backward is compiled with
    the forward), so the warm start runs no AOTAutograd, and a backward that
    does come later runs from the plan, with eager's gradients."""
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    deltas = []
    for _ in range(2):  # cold, then from the plan (a fresh backend, as in a new process)
        torch._dynamo.reset()
        model, eager = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        eager.load_state_dict(model.state_dict())
        before = ltc_cache.stats()
        compiled = torch.compile(model, backend=LtcBackend(GraphCache(CacheConfig.from_env())))
        torch.testing.assert_close(compiled(x), eager(x), atol=1e-6, rtol=1e-6)  # no backward
        after = ltc_cache.stats()
        deltas.append({name: after.get(name, 0) - before.get(name, 0)
                       for name in ("aot_traces", "plan_hits", "errors")})
    assert deltas == [{"aot_traces": 1, "plan_hits": 0, "errors": 0},
                      {"aot_traces": 0, "plan_hits": 1, "errors": 0}], deltas
    compiled(x).pow(2).sum().backward()
    eager(x).pow(2).sum().backward()
    for got, want in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad, atol=1e-6, rtol=1e-6)
