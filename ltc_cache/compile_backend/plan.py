"""Partitioning plans: the aten graph AOTAutograd made of an inference graph,
split into LTC regions and an eager rest, stored so that a warm start runs
neither AOTAutograd nor the partitioner again.

A Dynamo graph that LTC cannot lower whole is decomposed by AOTAutograd and
partitioned (:mod:`ltc_cache.compile_backend.backend`). On a warm start its LTC regions are
cache hits, but AOTAutograd would still run: 0.4-0.6 s of a 2 s warm start
for the small transformers of the tests, and partitioning 0.65 s of a GPT-2
training start. Its graphs, and how they are partitioned, depend only on
what the whole graph's key covers (the Dynamo graph, the input layouts, the
torch build) and on ltc_cache's own code that makes them (decompositions,
partitioner), so they are stored as an entry of its own kind, ``plan``,
under that key plus a digest of that code (:func:`plan_key`).

A plan is kept only where AOTAutograd's runtime wrapper adds nothing to the
graph's own call: no input mutated (but by the graph itself, ``copy_`` into
it: a static key/value cache), no output that aliases an input or
another output, no tensor subclass, no effect tokens or RNG state
(:func:`runs_bare`). It holds the partitioned graph
(:class:`ltc_cache.compile_backend.partition.Partitioned`): the parent graph, which calls
each region as a submodule, and each region's graph. Both are stored as
data, never as code (:mod:`ltc_cache.compile_backend.graph_wire`: each node's
op, name, target and arguments, and the tensor constants it reads by
value). Node names are kept, so the regions rebuilt in a warm process have
the code, and so the cache keys, of those the cold process stored.
"""

from __future__ import annotations

import functools
import hashlib
import types
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from ..entries.entry import Entry, new_meta
from ..entries.keys import CacheKey, code_digest, derived_key
from ..entries.kinds import EntryKind
from ..entries.wire import PLAN_FORMAT
from ..errors import EntryError
from ..graph.graph_keys import graph_digest
from .graph_wire import PLAN_VERSION, StoredRegion, graph_from_wire, graph_to_wire
from .partition import REGION_PREFIX, Partitioned

__all__ = ["bare_inference", "partitioned_from_wire", "partitioned_to_wire", "plan_entry",
           "plan_graph", "plan_key", "runs_bare"]


def plan_key(key: CacheKey, *, training: bool = False) -> CacheKey:
    """The plan's key: the whole graph's key, plus the code that decides
    what a plan holds (:func:`_deciding_code`), plus whether it is a training
    plan (forward and backward, :mod:`ltc_cache.compile_backend.joint`)."""
    kind = "training" if training else "inference"
    return derived_key(key, plan=f"{PLAN_FORMAT}:{PLAN_VERSION}:{kind}:{_deciding_code()}")


@functools.lru_cache(maxsize=1)
def _deciding_code() -> str:
    """A digest of the code that makes a plan's content, beside the graph
    and the torch build the whole graph's key covers: ltc_cache's
    decompositions (what AOTAutograd makes), the partitioner, and the rules
    of what may go into a region. By bytecode, so that a changed comment or
    log line keeps every stored plan, while a changed rule makes new ones;
    and by the values of the modules' constants, which their functions
    read by name (``partition._MIN_VIEW_ELEMENTS``, ``REGION_PREFIX``)."""
    from . import (
        buffer_writes,
        decompose,
        decompose_vision,
        partition,
        region_cuts,
        support,
    )

    modules = (decompose, decompose_vision, partition, region_cuts,
               buffer_writes)
    functions = [value for module in modules for value in vars(module).values()
                 if isinstance(value, types.FunctionType)
                 and value.__module__ == module.__name__]
    functions += [support.op_signature, support.static_rules, support.strided_otherwise,
                  support.strides_its_own_order, support.OpSupport.why_not]
    parts = [f"{f.__qualname__}={code_digest(f.__code__)}" for f in functions]
    parts += [f"{module.__name__}.{name}={value!r}" for module in modules
              for name, value in vars(module).items()
              if not name.startswith("__") and type(value) in (bool, int, float, str)]
    digest = hashlib.sha256()
    for part in sorted(parts):
        digest.update(f"{part}\0".encode())
    return digest.hexdigest()


def plan_entry(parted: Partitioned | dict[str, Any], key: CacheKey, graph_name: str,
               **extra: Any) -> Entry:
    """The entry of kind ``plan`` whose payload holds ``parted`` (or its
    :func:`partitioned_to_wire` form) as ``plan``, and ``extra`` (a training
    plan's backward graph and layout); raises
    :class:`~ltc_cache.compile_backend.graph_wire.PlanError` for a
    graph a plan cannot hold."""
    wire = parted if isinstance(parted, dict) else partitioned_to_wire(parted)
    nodes = len(wire["graph"]["nodes"]) + sum(len(r[1]["nodes"]) for r in wire["regions"])
    meta = new_meta(graph_name=graph_name, node_count=nodes, graph_hash="", key_parts=key.parts)
    return Entry(key.digest, "", (), (), (), meta, kind=EntryKind.PLAN,
                 payload={"plan": wire, **extra})


def plan_graph(entry: Entry) -> Partitioned:
    """The partitioned graph a plan entry holds, to run; raises EntryError
    for a bad one."""
    return partitioned_from_wire(entry.payload.get("plan"), values=False)


def runs_bare(metadata: Any, example_inputs: Sequence[Any], *,
              output_types: frozenset[str] = frozenset({"non_alias"}),
              mutations_in_graph: bool = False) -> bool:
    """Whether AOTAutograd's inference graph, called on the flat inputs,
    returns exactly what the compiled function does (``metadata`` is its
    ``ViewAndMutationMeta``), given that the caller handles outputs of
    ``output_types`` (names of AOTAutograd's ``OutputType``). With
    ``mutations_in_graph``, an input whose data the graph itself writes
    (``copy_`` into it at the end: ``keep_inference_input_mutations``, a
    static key/value cache's ``index_copy_``) is no wrapper's business."""
    def mutated(i: Any) -> bool:
        if mutations_in_graph and i.mutation_type.name == "MUTATED_IN_GRAPH" \
                and not i.mutates_metadata and not i.mutates_storage_metadata:
            return False
        return bool(i.mutates_data or i.mutates_metadata or i.mutates_storage_metadata)

    return (
        all(type(x) in (torch.Tensor, torch.nn.Parameter) for x in example_inputs)
        and not any(mutated(i) for i in metadata.input_info)
        and all(o.output_type.name in output_types for o in metadata.output_info)
        and metadata.num_intermediate_bases == 0
        and not metadata.tokens
        and not metadata.is_rng_op_functionalized
        and metadata.num_outputs_rng_offset == 0
    )


def bare_inference(gm: fx.GraphModule, metadata: Any, example_inputs: Sequence[Any]) -> bool:
    """Whether AOTAutograd's inference graph ``gm`` (partitioned) can run
    without its runtime wrapper once it returns, itself, the outputs its
    wrapper hands back as the inputs they are (``OutputType.is_input``: a
    static key/value cache's buffers, updated in place and returned); makes
    ``gm`` return them so where it can. Inputs the graph updates must be
    updated by the graph (:func:`runs_bare`'s ``mutations_in_graph``)."""
    if not runs_bare(metadata, example_inputs, output_types=frozenset({"non_alias", "is_input"}),
                     mutations_in_graph=True) or metadata.num_mutated_inp_runtime_indices:
        return False
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    (output,) = [node for node in gm.graph.nodes if node.op == "output"]
    outputs = list(output.args[0]) if isinstance(output.args[0], list | tuple) else None
    if outputs is None or len(outputs) != len(metadata.output_info):
        return False
    changed = False
    for index, info in enumerate(metadata.output_info):
        if info.output_type.name != "is_input":
            continue
        if not isinstance(info.base_idx, int) or not 0 <= info.base_idx < len(placeholders):
            return False
        if outputs[index] is not placeholders[info.base_idx]:
            outputs[index] = placeholders[info.base_idx]
            changed = True
    if changed:
        output.args = (type(output.args[0])(outputs),)
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return True


def partitioned_to_wire(parted: Partitioned) -> dict[str, Any]:
    """``parted`` as msgpack-able data: the parent graph, each region's
    graph and the op counts; raises
    :class:`~ltc_cache.compile_backend.graph_wire.PlanError` for a graph a plan
    cannot hold."""
    regions = [parted.module.get_submodule(name) for name in parted.regions]
    return {
        "graph": graph_to_wire(parted.module, parted.regions),
        # A region's digest is the graph part of its key, stored so that a
        # warm start need not generate its code to look its entry up; the
        # rebuilt region has the same code (node names are kept), so the
        # same digest (docs/torch/aot-autograd.md#plan-stores-region-digests).
        "regions": [[name, graph_to_wire(region), parted.region_ops[name], graph_digest(region)]
                    for name, region in zip(parted.regions, regions, strict=True)],
        "total_ops": parted.total_ops,
        "eager_ops": dict(parted.eager_ops),
    }


def partitioned_from_wire(obj: Any, *, values: bool = True) -> Partitioned:
    """The partitioned graph :func:`partitioned_to_wire` wrote; raises
    EntryError for anything else. ``values=False``: its parent graph's
    nodes carry no recorded values
    (:func:`~ltc_cache.compile_backend.graph_wire.graph_from_wire`)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("regions"), list) \
            or not isinstance(obj.get("eager_ops"), dict):
        raise EntryError("not a plan of this ltc_cache")
    regions: dict[str, fx.GraphModule] = {}
    region_ops: dict[str, int] = {}
    for item in obj["regions"]:
        # [name, graph, ops, digest]
        if not (isinstance(item, list) and len(item) == 4 and isinstance(item[0], str)
                and item[0] == f"{REGION_PREFIX}{len(regions)}" and isinstance(item[2], int)
                and isinstance(item[3], str)):
            raise EntryError(f"plan: malformed region {item!r:.80}")
        name, wire, ops, digest = item
        regions[name] = StoredRegion(wire, digest)
        region_ops[name] = ops
    module = graph_from_wire(obj.get("graph"), regions, values=values)
    total, eager = obj.get("total_ops"), obj["eager_ops"]
    if not isinstance(total, int) or not all(isinstance(k, str) and isinstance(v, int)
                                             for k, v in eager.items()):
        raise EntryError("plan: malformed op counts")
    return Partitioned(module, tuple(regions), region_ops, total, eager)
