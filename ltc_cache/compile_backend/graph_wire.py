"""An FX graph as data: the wire form in which a partitioning plan
(:mod:`ltc_cache.compile_backend.plan`) stores its parent graph and each of
its regions' graphs, and the graph modules rebuilt from it.

Why data, not code: a plan entry is read by a later process, which must be
able to check everything in it before trusting it (no pickle, no generated
Python run), and whose regions must come back with the code, so the cache
keys, of those the cold process stored.

The wire form of a graph is a msgpack-able map: its ``format``
(``PLAN_FORMAT``) and :data:`PLAN_VERSION`, the module's training flag, the
tensor constants its ``get_attr`` nodes read (by value, as an entry stores
tensors), and its nodes in order, each as ``[op, name, target, args,
kwargs, value]``. A target is kept by name and resolved only to a
registered operator overload, ``operator.getitem``, a region of the plan
(a ``call_module``) or one of the two higher-order ops AOTAutograd's
partitioner wraps a recomputed random op in (:data:`_RNG_WRAPPERS`, whose
first argument is an operator overload too); arguments are plain values,
node references, tuples, devices, dtypes, layouts and memory formats. What
FX reads beside that, the dtype, shape and stride of each node's value,
is recorded and comes back as meta tensors. Node names are kept. Anything
else is refused when written (:class:`PlanError`) and when read
(:class:`~ltc_cache.errors.EntryError`), so a bad entry is dropped rather
than run.
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

import msgpack
import torch
from torch import fx

from ..entries.entry import tensor_from_wire, tensor_to_wire
from ..entries.wire import PLAN_FORMAT, unpack
from ..errors import EntryError, PlanError
from ..fx_ops import HigherOrderOperator, OpOverload, lazy_module_class, rng_wrapper
from .nodes import is_symbolic

__all__ = ["PLAN_VERSION", "StoredRegion", "graph_from_wire", "graph_to_wire",
           "rng_wrapper_name"]

# The version of a plan's payload, written into each graph's wire form and
# checked when it is read; the plan's key hashes it too
# (:func:`ltc_cache.compile_backend.plan.plan_key`), so a change of this wire
# form, or of anything else a plan holds, bumps it and makes new keys.
# 2: the partitioned graph, not AOTAutograd's graph before partitioning;
# 3: a training plan's layout names the outputs AOTAutograd re-views;
# 4: a training plan records whether its backward recomputes checkpointed
# blocks (``recomputes``), which its backward's library is compiled for;
# 5: every region holds the digest of its key's graph part
# (docs/torch/aot-autograd.md#plan-stores-region-digests)
PLAN_VERSION = 5
_BUILTINS = {"operator.getitem": operator.getitem}
# The higher-order ops a plan holds, by name: AOTAutograd's partitioner wraps
# an op tagged ``nondeterministic_seeded`` that an activation-checkpointed
# region recomputes in the first in the forward (it returns the CPU
# generator's state with the op's result) and in the second in the backward
# (it runs the op under that state), so that the recomputation draws what
# the forward drew (``functionalize_rng_ops`` in
# ``torch/_functorch/partitioners.py``;
# docs/torch/aot-autograd.md#checkpointing-adds-hop-and-rng-wrappers). Both take the wrapped op's
# overload as an argument.
_RNG_WRAPPERS = ("run_and_save_rng_state", "run_with_rng_state")
_ENUMS = {
    "dtype": torch.dtype,
    "memory_format": torch.memory_format,
    "layout": torch.layout,
}


# --- to the wire ---------------------------------------------------------------


def _target_to_wire(node: fx.Node, regions: Sequence[str]) -> str:
    if node.op in ("placeholder", "output", "get_attr") \
            or (node.op == "call_module" and node.target in regions):
        return str(node.target)
    if node.op == "call_function":
        if isinstance(node.target, OpOverload):
            return str(node.target)  # "aten.addmm.default"
        if node.target is operator.getitem:
            return "operator.getitem"
        name = rng_wrapper_name(node.target)
        if name is not None:
            return f"higher_order.{name}"
    raise PlanError(f"node {node.name}: {node.op} of {node.target!r}")


def rng_wrapper_name(target: Any) -> str | None:
    """The name of ``target`` where it is one of :data:`_RNG_WRAPPERS`."""
    if not isinstance(target, HigherOrderOperator):
        return None
    name = target.name()
    return name if name in _RNG_WRAPPERS and rng_wrapper(name) is target else None


def _value_to_wire(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, fx.Node):
        return {"node": value.name}
    if isinstance(value, OpOverload):  # the op a random-op wrapper runs
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
    return {"format": PLAN_FORMAT, "version": PLAN_VERSION, "training": gm.training, "nodes": nodes,
            "constants": constants}



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
        wrapper = rng_wrapper(name)
        if isinstance(wrapper, HigherOrderOperator):
            return wrapper
        raise EntryError(f"plan: no operator {target!r} in this torch")
    return _overload_from_wire(target)


def _overload_from_wire(target: str) -> OpOverload:
    parts = target.split(".")
    if len(parts) != 3:
        raise EntryError(f"plan: {target!r} is not an operator overload")
    namespace, name, overload = parts
    try:
        resolved = getattr(getattr(getattr(torch.ops, namespace), name), overload)
    except (AttributeError, RuntimeError):
        raise EntryError(f"plan: no operator {target!r} in this torch") from None
    if not isinstance(resolved, OpOverload):
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
            or obj.get("version") != PLAN_VERSION:
        raise EntryError("not a plan of this ltc_cache")
    constants = obj.get("constants")
    if not isinstance(constants, dict):
        raise EntryError("plan: constants are not a map")
    for name in constants:
        if not isinstance(name, str) or not name.isidentifier():
            raise EntryError(f"plan: constant name {name!r}")
    return constants



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
    stores (docs/torch/aot-autograd.md#plan-stores-region-digests) and binds its constants; the
    graph itself is needed only to trace the region (a miss) or to run it
    eagerly, and building it was half of rebuilding a plan
    (docs/torch/aot-autograd.md#stored-regions-built-only-when-needed). Its wire form is checked
    here as :func:`graph_from_wire` checks it, so that building it later cannot fail on what the
    entry holds."""

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
        # Kept packed: one bytes object, which the cyclic collector never
        # walks, instead of a list and a dict a node that live as long as the
        # plan (docs/torch/dynamo.md#cyclic-gc-during-warm-loads).
        self._wire: bytes | None = msgpack.packb(wire, use_bin_type=True)
        self._built: fx.GraphModule | None = None

    def graph_module(self) -> fx.GraphModule:
        if self._built is None:
            assert self._wire is not None
            self._built = graph_from_wire(unpack(self._wire), lazy=True,
                                          constants=self.constants)
            self._wire = None
        return self._built

    def forward(self, *args: Any) -> Any:
        return self.graph_module()(*args)
