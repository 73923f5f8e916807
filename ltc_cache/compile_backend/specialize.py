"""A Dynamo graph made concrete for one call, in one canonical form.

An LTC graph is traced for one shape, so a Dynamo graph with symbolic shapes
is compiled once per concrete input layout. Compiled from the symbolic graph
itself, each shape would have a key of its own graph (the one with ``s50``
in it), distinct from the static graph Dynamo made of the same code at the
same shape before its automatic dynamic shapes kicked in: the first shape
would be compiled twice, and a warm process meeting the shapes in another
order (static first for another shape) would find nothing stored.

:func:`specialize` rewrites a graph for concrete values: every node whose
value is a Python scalar or a size (symbolic sizes, their arithmetic,
``x.size()``, ``.item()`` of a float Dynamo passed as a 0-dim tensor input)
is folded into a constant in its users, placeholders left unused are
dropped, and the remaining nodes are renamed in graph order. A static graph
and a symbolic graph of the same code at the same shapes come out the same,
so they share every key (plans, regions). Folding ``.item()`` of an input is
also what keeps ``dynamic=True`` off AOTAutograd's data-dependent path: that
value is read from the real input when the shape is compiled and is part of
the per-shape signature (:func:`scalar_inputs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

from ..errors import Unspecializable
from .aot_autograd import is_fake

__all__ = ["scalar_inputs", "specialize"]

_SYMBOLIC = torch.SymInt | torch.SymFloat | torch.SymBool
_ITEM_TARGETS = ("item", torch.ops.aten._local_scalar_dense.default)


def _placeholders(gm: fx.GraphModule) -> list[fx.Node]:
    return [node for node in gm.graph.nodes if node.op == "placeholder"]


def _example(node: fx.Node) -> Any:
    return node.meta.get("example_value", node.meta.get("val"))


def _is_item(node: fx.Node) -> bool:
    return node.op in ("call_method", "call_function") and node.target in _ITEM_TARGETS \
        and len(node.args) == 1 and isinstance(node.args[0], fx.Node) \
        and node.args[0].op == "placeholder"


def scalar_inputs(gm: fx.GraphModule) -> list[int]:
    """Positions of the inputs whose value :func:`specialize` reads (those
    ``.item()`` is called on): the per-shape signature must hold their value."""
    index = {node: i for i, node in enumerate(_placeholders(gm))}
    return sorted({index[node.args[0]] for node in gm.graph.nodes if _is_item(node)})


def _bind(bindings: dict[Any, Any], value: Any, actual: Any) -> None:
    if isinstance(value, _SYMBOLIC):
        expr = value.node.expr
        if getattr(expr, "is_Symbol", False):
            bindings[expr.name] = actual  # by name: one symbol can be several objects


def _bindings(placeholders: Sequence[fx.Node], args: Sequence[Any]) -> dict[Any, Any]:
    """Each symbol of the placeholders' example values, bound to the value
    it has in ``args``."""
    bindings: dict[Any, Any] = {}
    for node, arg in zip(placeholders, args, strict=True):
        example = _example(node)
        if isinstance(example, torch.Tensor) and isinstance(arg, torch.Tensor):
            for value, actual in zip((*example.shape, *example.stride()),
                                     (*arg.shape, *arg.stride()), strict=True):
                _bind(bindings, value, actual)
            _bind(bindings, example.storage_offset(), arg.storage_offset())
        else:
            _bind(bindings, example, arg)
    return bindings


def _concrete(value: Any, bindings: dict[Any, Any]) -> Any:
    """``value`` with every symbol bound; raises :class:`Unspecializable`
    for anything else than scalars and sequences of them."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, _SYMBOLIC):
        import sympy

        expr = value.node.expr
        expr = expr.xreplace({symbol: sympy.sympify(bindings[symbol.name])
                              for symbol in expr.free_symbols if symbol.name in bindings})
        if expr.free_symbols:
            raise Unspecializable(f"a value that depends on tensor data ({value})")
        kind = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(value)]
        return kind(expr)
    if isinstance(value, torch.Size | tuple):  # a size is written as the tuple it is
        return tuple(_concrete(v, bindings) for v in value)
    if isinstance(value, list):
        return [_concrete(v, bindings) for v in value]
    raise Unspecializable(f"a value of type {type(value).__name__}")


def _folds(node: fx.Node) -> bool:
    """Whether ``node`` computes a Python scalar or size (so it can be
    folded): its example value holds no tensor, and it is a plain call."""
    if node.op not in ("call_function", "call_method"):
        return False
    example = _example(node)
    if example is None:  # no value recorded, or a call for its effect
        return False
    flat = example if isinstance(example, tuple | list | torch.Size) else (example,)
    return all(v is None or isinstance(v, bool | int | float | _SYMBOLIC) for v in flat)


def specialize(gm: fx.GraphModule, args: Sequence[Any], *,
               drop_unused: bool = True) -> tuple[fx.GraphModule, list[int]]:
    """``gm`` for the concrete ``args`` (real tensors, or fake ones of a
    static graph), in canonical form, and the positions of ``args`` the new
    graph takes. ``drop_unused=False`` keeps every placeholder (a graph
    compiled under Dynamo's tracing context must take the inputs it was
    given). Raises :class:`Unspecializable`."""
    placeholders = _placeholders(gm)
    if len(placeholders) != len(args):
        raise Unspecializable("the arguments do not match the graph's inputs")
    bindings = _bindings(placeholders, args)
    position = {node: i for i, node in enumerate(placeholders)}
    graph = fx.Graph()
    env: dict[fx.Node, Any] = {}
    kept: list[int] = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            example = _example(node)
            if drop_unused and not isinstance(example, torch.Tensor):
                env[node] = _concrete(args[position[node]], bindings)  # a scalar input
                continue
            env[node] = graph.placeholder(node.target)
            kept.append(position[node])
        elif _is_item(node) and isinstance(args[position[node.args[0]]], torch.Tensor) \
                and not is_fake(args[position[node.args[0]]]):
            env[node] = args[position[node.args[0]]].item()
            _bind(bindings, _example(node), env[node])  # what arithmetic on it reads
        elif _folds(node):
            env[node] = _concrete(_example(node), bindings)
        elif node.op == "output":
            graph.output(fx.map_arg(node.args[0], lambda n: env[n]))
        else:
            new = graph.create_node(node.op, node.target, fx.map_arg(node.args, lambda n: env[n]),
                                    fx.map_arg(node.kwargs, lambda n: env[n]))
            # Names of the modules it came from, for the entry names; not
            # the symbolic values, which no longer hold.
            new.meta = {k: v for k, v in node.meta.items()
                        if k not in ("example_value", "val", "unbacked_bindings")}
            env[node] = new
    if drop_unused:
        new_placeholders = [node for node in graph.nodes if node.op == "placeholder"]
        for node, arg in zip(new_placeholders, list(kept), strict=True):
            if not node.users:  # an input only its folded .item() read
                kept.remove(arg)
                graph.erase_node(node)
    graph.lint()
    result = fx.GraphModule(gm, graph)
    result.train(gm.training)
    return result, kept
