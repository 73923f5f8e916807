"""Whole-plan libraries (ltc_cache/compile_backend/plan_library.py): a stored
plan's graph compiled by AOTInductor into one library, called in place of
its regions and eager ops. The slow tests compile for real (three plan
libraries and their regions' libraries: minutes); the others refuse
before any compile."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest
import torch
from helpers import child_env, json_child, once_per_run

from ltc_cache import CacheConfig, GraphCache
from ltc_cache.compile_backend import plan_library, plan_rng
from ltc_cache.entries.entry import decode, encode
from ltc_cache.entries.wire import is_entry_key
from ltc_cache.graph.fused.library_entries import usable_library
from ltc_cache.signing import program_secret

needs_a_compiler = pytest.mark.skipif(shutil.which(os.environ.get("CXX") or "g++") is None,
                                      reason="no C++ compiler")


def stored(directory: Path, kind: str) -> dict[str, object]:
    """The entries of ``kind`` in the cache ``directory``, by graph name."""
    store = GraphCache(CacheConfig(directory=directory, fuse="off")).store
    found = {}
    for key in store.keys():  # noqa: SIM118 (a store, not a dict)
        if not is_entry_key(key):
            continue
        entry = decode(store.get(key), expected_key=key, secret=None)
        if entry.kind == kind:
            found[entry.graph_name] = entry
    store.close()
    return found


@pytest.fixture(scope="session")
def cold_then_warm(tmp_path_factory) -> dict:
    """Once for the run: tests/children/fused_plan.py in a cold process that
    compiles every library (LTC_CACHE_FUSE=sync), then in a warm one."""

    def run(root: Path) -> dict:
        env = child_env(LTC_CACHE_DIR=str(root / "ltc"), LTC_CACHE_FUSE="sync",
                        XDG_CONFIG_HOME=str(root / "config"))
        cold = json_child("fused_plan.py", env=env, timeout=1800)
        warm = json_child("fused_plan.py", env=env, timeout=600)
        # What tests copy to change: the directory itself is read by tests
        # beside them, whose sqlite files come and go while it is copied.
        shutil.copytree(root / "ltc", root / "to-copy")
        return {"cold": cold, "warm": warm}

    root, runs = once_per_run(tmp_path_factory, "fused_plan", run)
    return {**runs, "directory": root / "ltc", "to_copy": root / "to-copy",
            "config": root / "config"}


@pytest.mark.slow
@needs_a_compiler
def test_a_warm_process_runs_each_plan_through_its_library(cold_then_warm):
    """An inference plan and a training plan (forward and backward), each
    regions around an eager ``sign`` and a buffer written in place, the
    training one with a checkpointed attention: the cold process compiles
    their libraries and compares each one's first call, the warm one loads
    all three, traces nothing, compares nothing (the verdicts are kept),
    runs no region, and computes and writes what eager does."""
    cold, warm = cold_then_warm["cold"], cold_then_warm["warm"]
    for run in (cold, warm):
        assert run["infer_error"] < 1e-5 and run["train_error"] < 1e-5, run
        assert "fused_plan_refused" not in run["stats"], run
    assert cold["stats"]["fused_plan_checks"] == cold["stats"]["fused_plan_loads"] == 3, cold
    stats = warm["stats"]
    assert stats["traces"] == 0 and stats["plan_hits"] == 2, stats
    assert stats["fused_plan_loads"] == 3 and "fused_plan_checks" not in stats, stats
    # With their verdicts kept, the libraries run from the first call: no
    # region runs, so none of their libraries is loaded.
    assert stats.get("fused_loads", 0) == 0 and stats.get("ltc_ops", 0) == 0, stats
    plans = stored(cold_then_warm["directory"], "plan")
    assert sorted(plans) == ["Signed.inference.plan", "Signed.training.plan"], plans
    # The checkpointed attention's generator-state wrappers, which the
    # libraries call through (plan_rng.unwrap_rng).
    training = plans["Signed.training.plan"].payload
    assert "run_and_save_rng_state" in repr(training["plan"]), training
    assert "run_with_rng_state" in repr(training["backward"]), training


@pytest.mark.slow
@needs_a_compiler
def test_a_tampered_plan_library_is_refused_and_the_regions_run(cold_then_warm, tmp_path):
    """A byte of the inference plan's library flipped (its sha256 recorded
    anew, so only the signature gives it away): the warm process refuses
    it, runs the plan's regions and still computes what eager does, and
    loads the training plan's two libraries."""
    directory = tmp_path / "ltc"
    shutil.copytree(cold_then_warm["to_copy"], directory)
    [plan] = [e for name, e in stored(directory, "plan").items() if "inference" in name]
    key = plan_library.part_key(plan.key, "inference")
    cache = GraphCache(CacheConfig(directory=directory, fuse="off"))
    entry = cache.lookup_entry(key, count=False)
    library = bytearray(entry.payload["library"])
    library[len(library) // 2] ^= 0xFF
    import hashlib

    payload = dict(entry.payload, library=bytes(library),
                   library_sha256=hashlib.sha256(library).hexdigest())
    cache.store.put(key.digest, encode(dataclasses.replace(entry, payload=payload)))
    secret = program_secret(None, directory, environ={
        "XDG_CONFIG_HOME": str(cold_then_warm["config"])})
    with pytest.raises(Exception, match="signature mismatch"):
        usable_library(cache.lookup_entry(key, count=False), secret, plan.key)
    cache.store.close()

    # Read-only: the library is refused, and nothing queued for a worker.
    env = child_env(LTC_CACHE_DIR=str(directory), LTC_CACHE_FUSE="background",
                    LTC_CACHE_READONLY="1", XDG_CONFIG_HOME=str(cold_then_warm["config"]))
    run = json_child("fused_plan.py", env=env, timeout=600)
    assert run["infer_error"] < 1e-5 and run["train_error"] < 1e-5, run
    assert run["stats"]["fused_plan_loads"] == 2 and run["stats"]["traces"] == 0, run


def test_the_inputs_a_plan_writes_are_found_and_a_written_view_refused():
    """What a library's first call puts back: the inputs written by
    ``copy_`` (AOTAutograd's input mutations) and ``_foreach_copy_``
    (BatchNorm's statistics joined); a write into a view of an input
    could not be put back, so that plan has no library."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def writes(a, b, c, x):
        a.copy_(x)
        torch.ops.aten._foreach_copy_.default([c, b], [x * 2, x * 3])
        return (x + 1,)

    def writes_a_view(a, x):
        a[0].copy_(x[0])
        return (x + 1,)

    def writes_its_own(x):
        y = x * 2
        y.add_(1)
        return (y,)

    t = torch.randn(4)
    a, b, c = t.clone(), t.clone(), t.clone()
    assert plan_library.written_inputs(make_fx(writes)(a, b, c, t)) == [0, 1, 2]
    assert plan_library.written_inputs(make_fx(writes_its_own)(t)) == []
    with pytest.raises(Exception, match=plan_library.WRITES_A_VIEW):
        plan_library.written_inputs(make_fx(writes_a_view)(t.view(2, 2).clone(), t.view(2, 2)))


def test_a_backward_library_has_a_key_of_its_own():
    forward = plan_library.part_key("a" * 64, "forward")
    assert forward == plan_library.part_key("a" * 64, "inference")  # what `fuse` looks up
    assert plan_library.part_key("a" * 64, "backward") != forward


def test_a_plans_integer_inputs_are_kept_for_its_build(tmp_path):
    """A decoding step indexes its key/value cache by a position: the build
    runs on the first real call's integer values, where shape and dtype
    still match, and random floats elsewhere; too many elements, a
    read-only cache or a garbled record keep nothing (zeros, as before)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from ltc_cache.compile_backend import plan_examples

    cache = GraphCache(CacheConfig(directory=tmp_path, fuse="off"))
    # x: not drawn from the global generator, which an earlier test may have
    # seeded as the build seeds its own.
    position, mask, x = torch.tensor([2]), torch.tensor([[True, False]]), torch.full((2, 3), 0.5)
    plan_examples.keep_example(cache, "a" * 64, plan_examples.integer_inputs([x, position, mask]))
    values = plan_examples.example_values(cache, "a" * 64)
    assert sorted(values) == [1, 2]
    assert torch.equal(values[1], position) and torch.equal(values[2], mask)

    graph = make_fx(lambda x, p, m: (x[:, p] * m,))(x, position, mask.long()[:, :1])
    inputs = plan_library._example_inputs(graph, [], values)
    assert torch.equal(inputs[1], position) and not inputs[0].eq(x).all()
    assert inputs[2].dtype == torch.int64 and not inputs[2].any()  # a dtype that differs

    too_many = torch.zeros(plan_examples.MAX_ELEMENTS + 1, dtype=torch.long)
    assert plan_examples.integer_inputs([too_many]) is None
    plan_examples.keep_example(cache, "b" * 64, plan_examples.integer_inputs([too_many]))
    cache.store.put(plan_examples.EXAMPLE_PREFIX + "c" * 64, b"\x93garbage")
    assert plan_examples.example_values(cache, "b" * 64) == {}
    assert plan_examples.example_values(cache, "c" * 64) == {}
    cache.store.close()


def test_a_plan_of_one_region_and_nothing_else_is_not_compiled_twice():
    """Its library would be its region's own: refused before any compile."""
    import operator

    from torch import fx

    def plan_graph(extra: bool) -> fx.GraphModule:
        root = torch.nn.Module()
        root.ltc_region_0 = torch.nn.Identity()
        graph = fx.Graph()
        x = graph.placeholder("x")
        region = graph.call_module("ltc_region_0", (x,))
        out = graph.call_function(operator.getitem, (region, 0))
        if extra:
            out = graph.call_function(torch.ops.aten.sign.default, (out,))
        graph.output((out,))
        return fx.GraphModule(root, graph)

    assert plan_library._one_region(plan_graph(extra=False))
    assert not plan_library._one_region(plan_graph(extra=True))


def _wrapped(op, inputs: int, *constants):
    """A forward and a backward as AOTAutograd's partitioner makes them
    around a recomputed ``op`` (docs/torch/aot-autograd.md#checkpointing-adds-hop-and-rng-wrappers)
    of ``inputs`` tensors, then ``constants``: the forward returns ``op``'s result and the
    generator's state, the backward (the state, then the tensors) runs ``op`` again
    under that state."""
    import operator

    from torch import fx
    from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

    forward, backward = fx.Graph(), fx.Graph()
    args = [forward.placeholder(f"x{i}") for i in range(inputs)]
    saved = forward.call_function(run_and_save_rng_state, (op, *args, *constants))
    forward.output((forward.call_function(operator.getitem, (saved, 1)),
                    forward.call_function(operator.getitem, (saved, 0))))
    state = backward.placeholder("state")
    args = [backward.placeholder(f"y{i}") for i in range(inputs)]
    backward.output((backward.call_function(run_with_rng_state, (state, op, *args, *constants)),))
    return fx.GraphModule(torch.nn.Module(), forward), fx.GraphModule(torch.nn.Module(), backward)


def test_a_recomputed_op_that_draws_nothing_is_called_without_its_wrappers():
    """``torch.export`` has no rule for the wrappers: a library calls the
    op itself where it has a ``dropout_p`` of 0 (a checkpointed attention),
    its caller puts the generator's state in the forward's place; an op
    that draws (dropout) keeps the plan from having a library."""
    import operator

    attention = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    q, k, v = torch.randn(3, 1, 2, 8, 16)
    forward, backward = _wrapped(attention, 3)
    assert plan_rng.rng_state_outputs(forward) == {1}
    assert plan_rng.rng_state_outputs(backward) == set()
    expected, state = forward(q, k, v)
    plan_rng.unwrap_rng(forward, [q, k, v])
    inputs = [torch.zeros(3, dtype=torch.uint8), q, k, v]
    plan_rng.unwrap_rng(backward, inputs)
    assert torch.equal(inputs[0], torch.get_rng_state())  # what the per-region path sets
    for graph in (forward, backward):
        assert all(n.op in ("placeholder", "output") or n.target in (attention, operator.getitem)
                   for n in graph.graph.nodes), graph.graph
    unwrapped, no_state = forward(q, k, v)
    assert torch.equal(unwrapped[0], expected[0]) and no_state is None
    assert torch.equal(backward(state, q, k, v)[0][0], expected[0])

    forward, backward = _wrapped(torch.ops.aten.bernoulli.p, 1, 0.5)
    for graph in (forward, backward):
        before = str(graph.graph)
        with pytest.raises(Exception, match=plan_rng.RANDOM_RECOMPUTED):
            plan_rng.unwrap_rng(graph, [q, q])
        assert str(graph.graph) == before


def test_a_backward_is_built_on_the_tensors_its_forward_saves(tmp_path):
    """BatchNorm's backward takes the inverse standard deviation its forward
    computed: drawn at random instead, a library and the regions can part
    far more than on a real step. Its saved inputs are what the forward
    computes on its own example inputs; its tangents stay random."""
    from ltc_cache.compile_backend.backend import LtcBackend
    from ltc_cache.compile_backend.joint import JointLayout

    torch._dynamo.reset()
    cache = GraphCache(CacheConfig(directory=tmp_path, fuse="off"))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh(),
                                torch.nn.Linear(8, 2))
    torch.compile(model, backend=LtcBackend(cache))(torch.randn(6, 4)).sum().backward()
    plan = next(iter(stored(tmp_path, "plan").values()))

    def examples(part: str) -> list[torch.Tensor]:
        graph = plan_library.plan_part_graph(plan, part).module
        return plan_library._example_inputs(graph, plan_library._input_kinds(plan, part), {})

    with torch.no_grad():
        saved = plan_library.plan_part_graph(plan, "forward").module(*examples("forward"))
    saved = saved[JointLayout.from_wire(plan.payload["joint"]).outputs:]
    drawn, inputs = examples("backward"), examples("backward")
    plan_library._saved_from_forward(cache, plan, inputs)
    assert len(saved) < len(inputs)
    for value, got in zip(saved, inputs, strict=False):
        assert torch.equal(got, value)
    assert any(not torch.equal(v, r) for v, r in zip(saved, drawn, strict=False))
    for got, random in zip(inputs[len(saved):], drawn[len(saved):], strict=True):
        assert torch.equal(got, random)  # the tangents
    cache.store.close()


def test_a_library_gets_its_inputs_in_the_layouts_it_was_compiled_for():
    """A backward's saved tensors come back from the regions contiguous
    where eager's were transposed views or broadcasts (BERT's position ids
    expanded over the batch, stride 0): each is laid out as recorded, a
    broadcast as one slice expanded (copying into a stride of 0 raised),
    with the values unchanged; what the library writes is copied back."""
    from ltc_cache.compile_backend import plan_function

    class Runner:
        def run(self, inputs):
            self.seen = inputs
            inputs[2].add_(1)
            return [inputs[0] + inputs[1].sum()]

    positions = torch.arange(8).expand(2, 8).contiguous()
    transposed, written = torch.randn(3, 4), torch.zeros(3)
    runner = Runner()
    out = plan_function._LaidOutRunner(runner, [(0, 1), (1, 3), None], [2]).run(
        [positions, transposed, written])
    assert [t.stride() for t in runner.seen[:2]] == [(0, 1), (1, 3)]
    assert torch.equal(runner.seen[0], positions) and torch.equal(runner.seen[1], transposed)
    assert runner.seen[2] is written and written.eq(1).all()
    torch.testing.assert_close(out[0], positions + transposed.sum())


def test_an_example_input_laid_out_as_a_broadcast_takes_a_real_calls_values():
    """BERT's position ids, expanded over the batch (stride 0): a plan's
    example input of that layout cannot be copied into whole (its elements
    share memory), so it takes the value's first slice, broadcast."""
    from torch.fx.experimental.proxy_tensor import make_fx

    positions = torch.arange(8).expand(2, 8)
    graph = make_fx(lambda p, x: (x + p,))(positions, torch.randn(2, 8))
    known = {0: torch.arange(8).expand(2, 8).contiguous() + 3}
    inputs = plan_library._example_inputs(graph, [], known)
    assert inputs[0].stride() == (0, 1) and torch.equal(inputs[0], known[0])


@pytest.mark.slow
@needs_a_compiler
def test_a_plan_librarys_first_check_queues_none_of_its_regions(cold_then_warm, tmp_path):
    """A process that finds the plans' libraries without their verdicts, and
    no fused entry of their regions (as the worker leaves them: a region a
    plan's library runs is not compiled), compares each library's first
    call with the per-region path; the regions that run for that
    comparison are not queued for libraries of their own (the plan's runs
    in their place), so no worker compiles them beside the process."""
    from ltc_cache.graph.fused import verdicts

    directory = tmp_path / "ltc"
    shutil.copytree(cold_then_warm["to_copy"], directory)
    cache = GraphCache(CacheConfig(directory=directory, fuse="off"))
    for store_key in list(cache.store.keys()):
        if not is_entry_key(store_key):
            continue
        entry = decode(cache.store.get(store_key), expected_key=store_key, secret=None)
        if entry.kind == "fused" and entry.payload.get("of") != "plan":
            cache.store.delete(store_key)
    dropped = 0
    for plan in stored(directory, "plan").values():
        for part in plan_library.plan_parts(plan):
            key = verdicts.verdict_key(plan_library.part_key(plan.key, part).digest)
            if cache.store.get(key) is not None:
                cache.store.delete(key)
                dropped += 1
    cache.store.close()
    assert dropped == 3, dropped
    env = child_env(LTC_CACHE_DIR=str(directory), LTC_CACHE_FUSE="background",
                    XDG_CONFIG_HOME=str(cold_then_warm["config"]))
    run = json_child("fused_plan.py", env=env, timeout=600)
    assert run["infer_error"] < 1e-5 and run["train_error"] < 1e-5, run
    stats = run["stats"]
    assert stats["fused_plan_checks"] == stats["fused_plan_loads"] == 3, stats
    assert "fused_queued" not in stats and "fused_plan_queued" not in stats, stats
    assert not [f for f in (directory / "fuse-queue").glob("*") if is_entry_key(f.name)]
