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
data, never as code: each node's op, name, target and arguments, a target
resolved only to a registered operator overload, ``operator.getitem``, a
region of the plan or one of the two higher-order ops AOTAutograd's
partitioner wraps a recomputed random op in (:data:`_RNG_WRAPPERS`, whose
first argument is an operator overload too), and the tensor constants it
reads by value. What FX reads beside that, the dtype, shape and stride of
each node's value, comes back as meta tensors. Node names are kept, so the
regions rebuilt in a warm process have the code, and so the cache keys, of
those the cold process stored.
"""

from __future__ import annotations

import functools
import hashlib
import operator
import types
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import fx

from ..errors import EntryError, LtcCacheError
from ..graph.entry import Entry, new_meta, tensor_from_wire, tensor_to_wire
from ..graph.keys import CacheKey, code_digest, derived_key, graph_digest
from ..wire import PLAN_FORMAT
from .nodes import is_symbolic
from .partition import REGION_PREFIX, Partitioned

__all__ = ["PlanError", "bare_inference", "graph_from_wire", "graph_to_wire",
           "partitioned_from_wire", "partitioned_to_wire", "plan_entry", "plan_graph", "plan_key",
           "rng_wrapper_name", "runs_bare"]

# 2: the partitioned graph, not AOTAutograd's graph before partitioning;
# 3: a training plan's layout names the outputs AOTAutograd re-views;
# 4: a training plan records whether its backward recomputes checkpointed
# blocks (``recomputes``), which its backward's library is compiled for
_VERSION = 4
_BUILTINS = {"operator.getitem": operator.getitem}
# The higher-order ops a plan holds, by name: AOTAutograd's partitioner wraps
# an op tagged ``nondeterministic_seeded`` that an activation-checkpointed
# region recomputes in the first in the forward (it returns the CPU
# generator's state with the op's result) and in the second in the backward
# (it runs the op under that state), so that the recomputation draws what
# the forward drew (``functionalize_rng_ops`` in
# ``torch/_functorch/partitioners.py``; fact 61 in docs/design.md). Both
# take the wrapped op's overload as an argument.
_RNG_WRAPPERS = ("run_and_save_rng_state", "run_with_rng_state")
_ENUMS = {
    "dtype": torch.dtype,
    "memory_format": torch.memory_format,
    "layout": torch.layout,
}


class PlanError(LtcCacheError, ValueError):
    """A graph that cannot be stored as a plan (a node or value of a kind a
    plan does not hold)."""


def plan_key(key: CacheKey, *, training: bool = False) -> CacheKey:
    """The plan's key: the whole graph's key, plus the code that decides
    what a plan holds (:func:`_deciding_code`), plus whether it is a training
    plan (forward and backward, :mod:`ltc_cache.compile_backend.joint`)."""
    kind = "training" if training else "inference"
    return derived_key(key, plan=f"{PLAN_FORMAT}:{_VERSION}:{kind}:{_deciding_code()}")


@functools.lru_cache(maxsize=1)
def _deciding_code() -> str:
    """A digest of the code that makes a plan's content, beside the graph
    and the torch build the whole graph's key covers: ltc_cache's
    decompositions (what AOTAutograd makes), the partitioner, and the rules
    of what may go into a region. By bytecode, so that a changed comment or
    log line keeps every stored plan, while a changed rule makes new ones;
    and by the values of the two modules' constants, which their functions
    read by name (``partition._MIN_VIEW_ELEMENTS``, ``REGION_PREFIX``)."""
    from . import decompose, decompose_vision, decompose_where, partition, support

    modules = (decompose, decompose_vision, decompose_where, partition)
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
    plan's backward graph and layout); raises :class:`PlanError` for a
    graph a plan cannot hold."""
    wire = parted if isinstance(parted, dict) else partitioned_to_wire(parted)
    nodes = len(wire["graph"]["nodes"]) + sum(len(r[1]["nodes"]) for r in wire["regions"])
    meta = new_meta(graph_name=graph_name, node_count=nodes, graph_hash="", key_parts=key.parts)
    return Entry(key.digest, "", (), (), (), meta, kind="plan", payload={"plan": wire, **extra})


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


# --- to the wire ---------------------------------------------------------------


def _target_to_wire(node: fx.Node, regions: Sequence[str]) -> str:
    if node.op in ("placeholder", "output", "get_attr") \
            or (node.op == "call_module" and node.target in regions):
        return str(node.target)
    if node.op == "call_function":
        if isinstance(node.target, torch._ops.OpOverload):
            return str(node.target)  # "aten.addmm.default"
        if node.target is operator.getitem:
            return "operator.getitem"
        name = rng_wrapper_name(node.target)
        if name is not None:
            return f"higher_order.{name}"
    raise PlanError(f"node {node.name}: {node.op} of {node.target!r}")


def rng_wrapper_name(target: Any) -> str | None:
    """The name of ``target`` where it is one of :data:`_RNG_WRAPPERS`."""
    if not isinstance(target, torch._ops.HigherOrderOperator):
        return None
    name = target.name()
    return name if name in _RNG_WRAPPERS and _rng_wrapper(name) is target else None


def _rng_wrapper(name: str) -> Any:
    from torch._prims import rng_prims

    return getattr(rng_prims, name, None)


def _value_to_wire(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, fx.Node):
        return {"node": value.name}
    if isinstance(value, torch._ops.OpOverload):  # the op a random-op wrapper runs
        return {"op": str(value)}
    if isinstance(value, list):
        return [_value_to_wire(v) for v in value]
    if isinstance(value, tuple):
        return {"tuple": [_value_to_wire(v) for v in value]}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    for kind, cls in _ENUMS.items():
        if isinstance(value, cls):
            return {kind: str(value).removeprefix("torch.")}
    raise PlanError(f"an argument of type {type(value).__name__}")


def _val_to_wire(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if is_symbolic(value):
            raise PlanError("a symbolic shape")
        return {"tensor": [str(value.dtype).removeprefix("torch."), list(value.shape),
                           list(value.stride())]}
    if isinstance(value, list | tuple):
        return [_val_to_wire(v) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    raise PlanError(f"a value of type {type(value).__name__}")


def graph_to_wire(gm: fx.GraphModule, regions: Sequence[str] = ()) -> dict[str, Any]:
    """``gm`` as msgpack-able data, with calls of the submodules named in
    ``regions``; raises :class:`PlanError` for a graph a plan cannot hold."""
    nodes, constants = [], {}
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = getattr(gm, node.target, None)
            if not isinstance(value, torch.Tensor) or "." in node.target:
                raise PlanError(f"get_attr {node.target} is not a tensor of the graph module")
            constants[node.target] = tensor_to_wire(value)
        kwargs = [[name, _value_to_wire(value)] for name, value in node.kwargs.items()]
        nodes.append([node.op, node.name, _target_to_wire(node, regions), _value_to_wire(node.args),
                      kwargs, _val_to_wire(node.meta.get("val"))])
    return {"format": PLAN_FORMAT, "version": _VERSION, "training": gm.training, "nodes": nodes,
            "constants": constants}


def partitioned_to_wire(parted: Partitioned) -> dict[str, Any]:
    """``parted`` as msgpack-able data: the parent graph, each region's
    graph and the op counts; raises :class:`PlanError` for a graph a plan
    cannot hold."""
    regions = [parted.module.get_submodule(name) for name in parted.regions]
    return {
        "graph": graph_to_wire(parted.module, parted.regions),
        # A region's digest is the graph part of its key, stored so that a
        # warm start need not generate its code to look its entry up; the
        # rebuilt region has the same code (node names are kept), so the
        # same digest (fact 44 in docs/design.md).
        "regions": [[name, graph_to_wire(region), parted.region_ops[name], graph_digest(region)]
                    for name, region in zip(parted.regions, regions, strict=True)],
        "total_ops": parted.total_ops,
        "eager_ops": dict(parted.eager_ops),
    }


# --- from the wire -------------------------------------------------------------


def _target_from_wire(op: str, target: Any, submodules: Collection[str]) -> Any:
    if not isinstance(target, str):
        raise EntryError(f"plan: {op} target is not a string")
    if op == "call_module" and target not in submodules:
        raise EntryError(f"plan: a call of {target!r}, which is not a region of the plan")
    if op != "call_function":
        return target
    if target in _BUILTINS:
        return _BUILTINS[target]
    kind, _, name = target.partition(".")
    if kind == "higher_order" and name in _RNG_WRAPPERS:
        wrapper = _rng_wrapper(name)
        if isinstance(wrapper, torch._ops.HigherOrderOperator):
            return wrapper
        raise EntryError(f"plan: no operator {target!r} in this torch")
    return _overload_from_wire(target)


def _overload_from_wire(target: str) -> torch._ops.OpOverload:
    parts = target.split(".")
    if len(parts) != 3:
        raise EntryError(f"plan: {target!r} is not an operator overload")
    namespace, name, overload = parts
    try:
        resolved = getattr(getattr(getattr(torch.ops, namespace), name), overload)
    except (AttributeError, RuntimeError):
        raise EntryError(f"plan: no operator {target!r} in this torch") from None
    if not isinstance(resolved, torch._ops.OpOverload):
        raise EntryError(f"plan: {target!r} is not an operator overload")
    return resolved


def _value_from_wire(obj: Any, nodes: Mapping[str, Any]) -> Any:
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, list):
        return [_value_from_wire(v, nodes) for v in obj]
    if not isinstance(obj, dict) or len(obj) != 1:
        raise EntryError(f"plan: unknown argument {obj!r:.80}")
    ((kind, ref),) = obj.items()
    if kind == "node":
        if ref not in nodes:
            raise EntryError(f"plan: argument names node {ref!r} before it is defined")
        return nodes[ref]
    if kind == "tuple" and isinstance(ref, list):
        return tuple(_value_from_wire(v, nodes) for v in ref)
    if kind == "device" and isinstance(ref, str):
        return torch.device(ref)
    if kind == "op" and isinstance(ref, str):
        return _overload_from_wire(ref)
    if kind in _ENUMS and isinstance(ref, str) and isinstance(getattr(torch, ref, None),
                                                               _ENUMS[kind]):
        return getattr(torch, ref)
    raise EntryError(f"plan: unknown argument {obj!r:.80}")


def _val_from_wire(obj: Any, *, build: bool = True) -> Any:
    """The value a node recorded; with ``build=False``, only checked."""
    if isinstance(obj, dict) and list(obj) == ["tensor"]:
        if not (isinstance(obj["tensor"], list) and len(obj["tensor"]) == 3):
            raise EntryError(f"plan: unknown value {obj!r:.80}")
        dtype, shape, stride = obj["tensor"]
        if not isinstance(getattr(torch, str(dtype), None), torch.dtype):
            raise EntryError(f"plan: unknown dtype {dtype!r}")
        if not (isinstance(shape, list) and isinstance(stride, list) and len(shape) == len(stride)
                and all(type(d) is int for d in (*shape, *stride))):
            raise EntryError(f"plan: malformed layout {obj!r:.80}")
        # Meta tensors: the layout FX's passes read, no memory.
        return torch.empty_strided(shape, stride, dtype=getattr(torch, dtype),
                                   device="meta") if build else None
    if isinstance(obj, list):
        return [_val_from_wire(v, build=build) for v in obj]
    if obj is None or isinstance(obj, bool | int | float):
        return obj
    raise EntryError(f"plan: unknown value {obj!r:.80}")


_NODE_KINDS = ("placeholder", "call_function", "call_module", "get_attr", "output")


def _nodes_from_wire(obj: Any, submodules: Collection[str],
                     constants: Mapping[str, Any],
                     nodes: dict[str, Any]) -> Iterator[tuple[Any, ...]]:
    """Each node of a graph's wire form, checked, as ``(op, name, target,
    args, kwargs, value)``; its arguments name the nodes before it through
    ``nodes``, which the caller fills in (name -> node) as it goes."""
    wired = obj.get("nodes")
    if not isinstance(wired, list) or not wired:
        raise EntryError("plan: malformed graph (no node list)")
    for index, item in enumerate(wired):
        if not (isinstance(item, list) and len(item) == 6):
            raise EntryError(f"plan: malformed node {item!r:.80}")
        op, name, target, args, kwargs, val = item
        if op not in _NODE_KINDS:
            raise EntryError(f"plan: node kind {op!r}")
        if not isinstance(name, str) or not name.isidentifier() or name in nodes:
            raise EntryError(f"plan: node name {name!r} is taken or not a name")
        if (op == "output") != (index == len(wired) - 1):  # one output, last
            raise EntryError("plan: the output is not the last node")
        if op == "get_attr" and target not in constants:
            raise EntryError(f"plan: get_attr of {target!r}, which is not a constant")
        if not (isinstance(kwargs, list) and all(
                isinstance(kw, list) and len(kw) == 2 and isinstance(kw[0], str)
                and kw[0].isidentifier() for kw in kwargs)):
            raise EntryError(f"plan: malformed keyword arguments of {name}")
        args = _value_from_wire(args, nodes)
        if not isinstance(args, tuple):
            raise EntryError(f"plan: the arguments of {name} are not a tuple")
        yield (op, name, _target_from_wire(op, target, submodules), args,
               {k: _value_from_wire(v, nodes) for k, v in kwargs}, val)


def _constants_wire(obj: Any) -> dict[str, Any]:
    if not isinstance(obj, dict) or obj.get("format") != PLAN_FORMAT \
            or obj.get("version") != _VERSION:
        raise EntryError("not a plan of this ltc_cache")
    constants = obj.get("constants")
    if not isinstance(constants, dict):
        raise EntryError("plan: constants are not a map")
    for name in constants:
        if not isinstance(name, str) or not name.isidentifier():
            raise EntryError(f"plan: constant name {name!r}")
    return constants


def lazy_module_class() -> type[fx.GraphModule]:
    """torch's GraphModule that generates its code on first use, where this
    torch has it (private: pinned by tests/compile_backend/test_plan.py), else GraphModule."""
    try:
        from torch.fx._lazy_graph_module import _LazyGraphModule
    except ImportError:
        return fx.GraphModule
    return _LazyGraphModule if issubclass(_LazyGraphModule, fx.GraphModule) else fx.GraphModule


def graph_from_wire(obj: Any, submodules: Mapping[str, torch.nn.Module] | None = None,
                    *, lazy: bool = False,
                    constants: Mapping[str, torch.Tensor] | None = None,
                    values: bool = True) -> fx.GraphModule:
    """The graph module :func:`graph_to_wire` wrote, with the same node names
    (so the regions rebuilt with it have the same keys) and ``submodules``
    for its region calls; raises EntryError for anything else. ``lazy``:
    its Python code is generated when first read or called, not here.
    ``constants``: its constants, where the caller made them already (a
    :class:`StoredRegion`, keyed by its stored digest: a name FX would
    change, which no plan this code wrote holds, only renames the node).
    ``values=False``: the nodes' recorded values are checked but not made
    (a parent graph that is only run reads none of them)."""
    submodules = submodules or {}
    wired = _constants_wire(obj)
    root = torch.nn.Module()
    for name, wire in wired.items():
        root.register_buffer(name, constants[name] if constants is not None
                             else tensor_from_wire(wire))
    for name, module in submodules.items():
        root.add_module(name, module)
    graph = fx.Graph()
    nodes: dict[str, fx.Node] = {}
    try:
        for op, name, target, args, kwargs, val in _nodes_from_wire(obj, submodules, wired,
                                                                    nodes):
            node = graph.create_node(op, target, args, kwargs, name=name)
            if node.name != name and constants is None:
                raise EntryError(f"plan: node name {name!r} is taken")
            if values and val is not None:
                node.meta["val"] = _val_from_wire(val)
            elif val is not None:
                _val_from_wire(val, build=False)
            nodes[name] = node
        graph.lint()
        gm = (lazy_module_class() if lazy else fx.GraphModule)(root, graph)
    except EntryError:
        raise
    except Exception as exc:  # a node list of the wrong shape
        raise EntryError(f"plan: malformed graph ({type(exc).__name__}: {exc})") from None
    gm.train(bool(obj.get("training")))
    return gm


class StoredRegion(torch.nn.Module):
    """A region of a stored plan whose FX graph is built on first use. A
    warm start looks the region's LTC entry up by the digest the plan
    stores (fact 44 in docs/design.md) and binds its constants; the graph
    itself is needed only to trace the region (a miss) or to run it
    eagerly, and building it was half of rebuilding a plan (fact 49). Its
    wire form is checked here as :func:`graph_from_wire` checks it, so that
    building it later cannot fail on what the entry holds."""

    def __init__(self, wire: Any, digest: str) -> None:
        super().__init__()
        wired = _constants_wire(wire)
        names: dict[str, str] = {}
        try:
            for _, name, _, _, _, val in _nodes_from_wire(wire, (), wired, names):
                _val_from_wire(val, build=False)
                names[name] = name
        except EntryError:
            raise
        except Exception as exc:
            raise EntryError(f"plan: malformed graph ({type(exc).__name__}: {exc})") from None
        self.digest = digest
        # Bound by name where the region's entry is replayed, as a built
        # region's buffers are.
        self.constants = {name: tensor_from_wire(w) for name, w in wired.items()}
        self._wire: Any = wire
        self._built: fx.GraphModule | None = None

    def graph_module(self) -> fx.GraphModule:
        if self._built is None:
            self._built = graph_from_wire(self._wire, lazy=True, constants=self.constants)
            self._wire = None
        return self._built

    def forward(self, *args: Any) -> Any:
        return self.graph_module()(*args)


def partitioned_from_wire(obj: Any, *, values: bool = True) -> Partitioned:
    """The partitioned graph :func:`partitioned_to_wire` wrote; raises
    EntryError for anything else. ``values=False``: its parent graph's
    nodes carry no recorded values (:func:`graph_from_wire`)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("regions"), list) \
            or not isinstance(obj.get("eager_ops"), dict):
        raise EntryError("not a plan of this ltc_cache")
    regions: dict[str, fx.GraphModule] = {}
    region_ops: dict[str, int] = {}
    for item in obj["regions"]:
        # [name, graph, ops, digest]; plans stored before digests lack the last.
        if not (isinstance(item, list) and len(item) in (3, 4) and isinstance(item[0], str)
                and item[0] == f"{REGION_PREFIX}{len(regions)}" and isinstance(item[2], int)
                and (len(item) == 3 or isinstance(item[3], str))):
            raise EntryError(f"plan: malformed region {item!r:.80}")
        name, wire, ops = item[:3]
        if len(item) == 4:
            regions[name] = StoredRegion(wire, item[3])
        else:
            # Lazy: the parent's GraphModule recompiles its submodules, and
            # a region's code is read only for its key, or to run it eagerly.
            regions[name] = graph_from_wire(wire, lazy=True)
        region_ops[name] = ops
    module = graph_from_wire(obj.get("graph"), regions, values=values)
    total, eager = obj.get("total_ops"), obj["eager_ops"]
    if not isinstance(total, int) or not all(isinstance(k, str) and isinstance(v, int)
                                             for k, v in eager.items()):
        raise EntryError("plan: malformed op counts")
    return Partitioned(module, tuple(regions), region_ops, total, eager)
