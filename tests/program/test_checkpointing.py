"""Gradient checkpointing (``model.gradient_checkpointing_enable()``, what
most fine-tuning turns on) through ``ltc_cache.compile``: stored as a
program, so that a warm process captures nothing and traces nothing, with
eager's losses and gradients and the recomputation really in the backward
(docs/torch/aot-autograd.md#checkpointing-adds-hop-and-rng-wrappers,
docs/torch/dynamo.md#checkpointed-block-may-restore-attributes and
docs/torch/aot-autograd.md#checkpointed-regions-kept-activations-alive).

The fast tests pin each cause on a small graph; the slow ones train GPT-2
and Llama (transformers configs, 2 layers, hidden 64) with micro-batches
accumulated and AdamW, cold then warm in child processes.
"""

from __future__ import annotations

import contextlib
import operator

import msgpack
import pytest
import torch
from helpers import json_child, relative_error
from torch import fx
from torch.utils.checkpoint import checkpoint

from ltc_cache.errors import EntryError

# -- what checkpointing adds to a program's graph and to a plan -----------------------------------
# (docs/torch/aot-autograd.md#checkpointing-adds-hop-and-rng-wrappers)


def _viewing_block(x: torch.Tensor) -> torch.Tensor:
    h = x.view(2, -1).transpose(0, 1)
    return (h.sin() * 2).sum(1)


def test_a_program_graph_with_a_checkpointed_block_is_saved(dynamo_reset):
    """Dynamo keeps a checkpointed block as a graph of its own (the
    ``wrap_body`` of ``tag_activation_checkpoint``), whose nodes record fake
    values; a view's holds its fake mode, which does not pickle. The
    program's graph is saved without them."""
    from torch.fx._graph_pickler import GraphPickler, Options

    from ltc_cache.program.program_graph import LtcProgramGraph

    captured = []

    def backend(gm, inputs):
        captured.append(gm)
        return gm.forward

    def fn(x):
        return checkpoint(_viewing_block, x, use_reentrant=False).cos()

    torch.compile(fn, backend=backend, fullgraph=True)(torch.randn(8, requires_grad=True))
    (gm,) = captured
    assert any(isinstance(m, fx.GraphModule) for m in gm.children())  # the block's graph
    with pytest.raises(AttributeError, match="pickle"):  # what torch's pickler meets there
        GraphPickler.dumps(gm, Options(ops_filter=None))
    data = LtcProgramGraph.serialize_compile_artifacts(LtcProgramGraph(gm, "fn"))
    loaded = LtcProgramGraph.deserialize_compile_artifacts(data)
    x = torch.randn(8)
    # What runs should the graph's stored plan fail on its first call.
    assert torch.equal(loaded._eager(x)[0], fn(x))


def test_a_checkpointed_block_in_inference_is_compiled(cache_dir, dynamo_reset):
    """Under ``no_grad`` the block is Dynamo's ``tag_activation_checkpoint``
    still: lowered whole, LTC would run torch.utils.checkpoint on its own
    device, which has no device module (the graph ran eagerly, with a
    warning). It goes through AOTAutograd, which inlines it."""
    import ltc_cache

    def fn(x):
        return checkpoint(_viewing_block, x, use_reentrant=False).cos()

    x = torch.randn(8)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(fn, backend="ltc_cache")(x), fn(x))
    stats = ltc_cache.stats()
    assert stats["errors"] == 0 and stats["plan_misses"] == 1 and stats["traces"] >= 1, stats


def _rng_graph() -> fx.GraphModule:
    """A recomputed random op as AOTAutograd's partitioner wraps it: run
    once saving the generator's state, then again under that state."""
    from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

    graph = fx.Graph()
    x = graph.placeholder("x")
    bernoulli = torch.ops.aten.bernoulli.p
    saved = graph.call_function(run_and_save_rng_state, (bernoulli, x, 0.5))
    state = graph.call_function(operator.getitem, (saved, 0))
    first = graph.call_function(operator.getitem, (saved, 1))
    again = graph.call_function(run_with_rng_state, (state, bernoulli, x, 0.5))
    graph.output((first, again))
    return fx.GraphModule(torch.nn.Module(), graph)


def test_a_plan_holds_the_wrappers_of_a_recomputed_random_op():
    from ltc_cache.compile_backend.graph_wire import graph_from_wire, graph_to_wire

    wire = msgpack.unpackb(msgpack.packb(graph_to_wire(_rng_graph())))
    rebuilt = graph_from_wire(wire)
    first, again = rebuilt(torch.rand(256))
    assert torch.equal(first, again)  # the recomputation drew what the first run drew
    assert not torch.equal(first, rebuilt(torch.rand(256))[0])  # and the generator moved on


def test_a_plan_resolves_only_the_two_wrappers_and_operator_overloads():
    from torch._higher_order_ops.wrap import tag_activation_checkpoint

    from ltc_cache.compile_backend.graph_wire import graph_from_wire, graph_to_wire
    from ltc_cache.errors import PlanError

    wire = graph_to_wire(_rng_graph())
    for target, arg in [("higher_order.tag_activation_checkpoint", None),
                        ("higher_order.run_with_rng_state.x", None),
                        (None, {"op": "builtins.eval"}), (None, {"op": "os.system.default"})]:
        bad = msgpack.unpackb(msgpack.packb(wire))
        node = bad["nodes"][1]  # the first wrapper
        if target is not None:
            node[2] = target
        else:
            node[3]["tuple"][0] = arg
        with pytest.raises(EntryError):
            graph_from_wire(bad)
    graph = fx.Graph()  # any other higher-order op is no plan's
    x = graph.placeholder("x")
    graph.output(graph.call_function(tag_activation_checkpoint, (x,)))
    with pytest.raises(PlanError):
        graph_to_wire(fx.GraphModule(torch.nn.Module(), graph))


# -- an attribute set and restored inside a checkpointed block ------------------------------------
# (docs/torch/dynamo.md#checkpointed-block-may-restore-attributes)


class _Holder:
    def __init__(self) -> None:
        self.value = None
        self.active = False


_HOLDER = _Holder()


def _restoring_block(x: torch.Tensor) -> torch.Tensor:
    # As the kernels package's layer wrapper does with its context variable.
    previous = _HOLDER.value
    _HOLDER.value = {"scale": x}
    _HOLDER.active = True
    try:
        return _HOLDER.value["scale"].sin() * 2
    finally:
        _HOLDER.value = previous
        _HOLDER.active = False


def _leaking_block(x: torch.Tensor) -> torch.Tensor:
    _HOLDER.value = {"scale": x}
    return x.sin() * 2


@pytest.mark.parametrize("block", [_restoring_block, _leaking_block])
def test_a_block_may_set_an_attribute_it_restores(block, dynamo_reset):
    """Dynamo refuses both blocks; during a program's capture the first,
    which puts back what it found, is one graph, and the second is still
    refused (Dynamo's own check, at the end of the block)."""
    from torch._dynamo.exc import Unsupported

    from ltc_cache.program.capture import restored_attributes_allowed

    def fn(x):
        return checkpoint(block, x, use_reentrant=False).sum()

    for allowed in (False, True):
        torch._dynamo.reset()
        x = torch.randn(4, requires_grad=True)
        compiled = torch.compile(fn, backend="eager", fullgraph=True)
        refused = not allowed or block is _leaking_block
        try:
            with restored_attributes_allowed() if allowed else contextlib.nullcontext():
                if refused:
                    with pytest.raises(Unsupported, match="side effect"):
                        compiled(x)
                    continue
                out = compiled(x)
            assert (_HOLDER.value, _HOLDER.active) == (None, False)  # as it found them
        finally:
            _HOLDER.value, _HOLDER.active = None, False
        out.backward()
        assert torch.allclose(x.grad, 2 * x.detach().cos())


# -- weight-gradient products join the later region they read -------------------------------------
# (docs/torch/aot-autograd.md#checkpointed-regions-kept-activations-alive)


def _two_regions(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.sin(x)  # recomputed activation: region A
    g = torch.mul(torch.cos(a), w)  # its gradient: region B, after A
    product = torch.mm(torch.t(a), g)  # a weight gradient: reads A and B
    return g, product


def test_a_product_reading_two_regions_joins_the_later():
    from torch.fx.passes.infra.partitioner import Partition
    from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

    from ltc_cache.compile_backend import partition

    gm = fx.symbolic_trace(_two_regions)
    nodes = {n.name: n for n in gm.graph.nodes}
    first = Partition(nodes=[nodes["sin"]])
    second = Partition(nodes=[nodes["cos"], nodes["mul"]])
    tail = Partition(nodes=[nodes["t"], nodes["mm"]])
    regions = partition._tails_to_their_producers([first, second, tail])
    assert regions == [first, second]
    assert {n.name for n in second.nodes} == {"cos", "mul", "t", "mm"}
    fuse_by_partitions(gm, [dict.fromkeys(p.nodes) for p in regions])  # no cycle
    x, w = torch.randn(3, 3), torch.randn(3, 3)
    assert all(torch.equal(a, b) for a, b in zip(gm(x, w), _two_regions(x, w), strict=True))


# -- end to end ----------------------------------------------------------------------------------


def child(*args: str) -> dict:
    return json_child("checkpointing.py", *args, timeout=900)


@pytest.mark.slow
@pytest.mark.parametrize(("model", "reentrant"), [("gpt2", False), ("llama", False),
                                                  ("gpt2", True)])
def test_checkpointed_training_cold_then_warm(model, reentrant, cache_dir):
    """4 micro-batches accumulated, AdamW, two steps; the warm process loads
    the program: no Dynamo frame, no AOTAutograd trace, no LTC trace."""
    pytest.importorskip("transformers")
    args = [model, "--batch", "4", "--seq", "64", "--memory",
            *(["--reentrant"] if reentrant else [])]
    cold = child(*args)
    warm = child(*args)
    assert cold["stats"]["program_captures"] == 1, cold["stats"]
    assert cold["stats"].get("program_fallbacks", 0) == 0, cold["stats"]  # one graph
    assert cold["frames_ok"] == 0 and cold["aot"] == 1 and cold["stats"]["traces"] > 0, cold
    stats = warm["stats"]
    assert warm["frames_ok"] == 0 and warm["aot"] == 0 and stats.get("aot_traces", 0) == 0, warm
    assert (stats["traces"], stats["misses"], stats.get("program_captures", 0)) == (0, 0, 0), stats
    assert stats["program_hits"] == 1 and stats.get("plan_hits", 0) >= 1, stats
    assert warm["losses"] == cold["losses"]
    for run in (cold, warm):
        assert relative_error(run["losses"], run["eager_losses"]) <= 1e-5, run
        assert run["grad_error"] <= 1e-5, run  # at the same weights, each step
        assert not run["warnings"] and run["stats"]["errors"] == 0, run
        held = run["held"]
        if held["eager"] is not None:
            # What a forward keeps for its backward: eager's checkpointed
            # step's, not the unchecked one's (the blocks are recomputed).
            assert held["ltc_cache"] <= 1.1 * held["eager"] + 32 * 1024, held
            assert held["ltc_cache"] < held["eager_unchecked"] / 3, held
