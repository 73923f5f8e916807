"""What the rewrites ask of a parsed graph and do to it: an op's schema
facts (:class:`_Op`: aliasing, writing, reading values only), the nodes
calling one op, putting a node or a value in another's place, and the
constants stored with an entry or written in its IR."""

from __future__ import annotations

import functools
import math
import re
from typing import NamedTuple

import torch

from ...entries.layout import Source
from ...errors import RewriteRefused
from ..torchscript_ir import Graph, Node, TensorType, Value, parse_ir, parse_schema

# Ops that read an input's strides or storage rather than its values, or
# reject some layouts: a view (non-contiguous, offset, stride 0) must not
# reach them where a fresh contiguous copy did.
_LAYOUT_READERS = ("as_strided", "_reshape_alias", "_unsafe_view", "view_as_real",
                   "view_as_complex", "view_copy.dtype", "contiguous", "stride",
                   "_nested", "data_ptr", "set_")


# Nodes without a schema that only build or take apart containers.
CONTAINERS = frozenset({"prim::ListConstruct", "prim::TupleConstruct"})


_STRUCTURAL = CONTAINERS | {"prim::Constant", "prim::ListUnpack", "prim::TupleUnpack"}


class _Op(NamedTuple):
    """What the rewrites need to know of an op's schema."""

    name: str  # with the overload: "aten::select.int"
    aliases: bool  # may return (or write) memory of an input
    writes: bool  # may write memory it did not allocate
    reads_values_only: bool  # no alias, and its result does not depend on strides
    arg_types: tuple[str, ...]


@functools.lru_cache(maxsize=1024)
def _op_of(schema_text: str) -> _Op | None:
    # Parsed once per distinct schema: a graph has thousands of nodes but few ops.
    if schema_text == "(no schema)":
        return None
    schema = parse_schema(schema_text)
    name = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
    aliases = any(a.alias_info is not None for a in (*schema.arguments, *schema.returns))
    writes = schema.is_mutable or any(a.alias_info is not None and a.alias_info.is_write
                                      for a in schema.arguments)
    layout = any(marker in name for marker in _LAYOUT_READERS)
    return _Op(name, aliases, writes, not aliases and not layout,
               tuple(str(a.type) for a in schema.arguments))


def op_facts(node: Node) -> _Op | None:
    return _op_of(node.schema())


def nodes_calling(graph: Graph, name: str) -> list[Node]:
    """The nodes of ``graph`` that call op ``name`` (with its overload),
    listed before a rewrite replaces any."""
    return [node for node in graph.nodes()
            if (op := op_facts(node)) is not None and op.name == name]


def may_write(node: Node) -> bool:
    """Whether ``node`` may write to memory it did not allocate (or is an
    op this module does not know, which is treated the same)."""
    kind = node.kind()
    if kind in _STRUCTURAL:
        return False
    if kind.startswith("prim::"):  # control flow (blocks) and the like
        return True
    op = op_facts(node)
    return op is None or op.writes


def reads_values_only(node: Node) -> bool:
    """Whether ``node`` reads its tensor inputs as values: its result neither
    aliases them nor depends on their strides."""
    op = op_facts(node)
    return op is not None and op.reads_values_only


def take_place(node: Node, value: Value) -> None:
    """``value`` stands in for ``node``'s single output, with its type, and
    ``node`` goes."""
    value.setType(node.output().type())
    node.output().replaceAllUsesWith(value)
    node.destroy()


def swap_in(graph: Graph, node: Node, kind: str,
            inputs: list[Value], overload: str) -> bool:
    """Put a ``kind`` node reading ``inputs`` in ``node``'s place if it
    resolves to ``overload``; whether it did (else the graph is as it was,
    but for constants made for it, which :func:`drop_dead_code` removes)."""
    with graph.insert_point_guard(node):
        new = graph.insertNode(graph.create(kind, inputs, 1))
    made = op_facts(new)
    if made is None or made.name != overload:
        new.destroy()
        return False
    take_place(node, new.output())
    return True


def stored_constants(graph: Graph, inputs: list[Source]) -> dict[int, torch.Tensor]:
    """The tensors stored with the entry, by the ``unique()`` of the graph
    input they are bound to."""
    params = list(graph.inputs())
    return {params[i].unique(): s.ref for i, s in enumerate(inputs)
            if s.kind == "const" and isinstance(s.ref, torch.Tensor)}


def tensor_constant(value: Value) -> torch.Tensor | None:
    node = value.node()
    if node.kind() != "prim::Constant" or not isinstance(value.type(), TensorType):
        return None
    constant = value.toIValue()
    return constant if isinstance(constant, torch.Tensor) else None


def is_real_dtype(dtype: torch.dtype) -> bool:
    return dtype != torch.bool and not dtype.is_complex


def scalar_value(t: torch.Tensor) -> bool | int | float | None:
    value = t.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# A tensor constant as LTC prints it: ``prim::Constant[value={-1}]()``.
_TENSOR_CONSTANT = re.compile(r"= prim::Constant\[value=\{([^{}]*)\}\]\(\)")


def parse_traced(ir: str) -> Graph:
    """``ir`` parsed with its tensor constants (LTC writes slice bounds as
    one-element tensor constants), each holding the number the text gives.

    ``parse_ir`` drops the sign of a tensor constant: ``{-1}`` reads back as
    ``tensor(1)`` (docs/torch/torchscript-ir.md#parse-ir-drops-constant-signs). Folded,
    ``x[:, -1:]`` (a language model's last position, as ``generate`` asks for it) sliced
    from the second row instead, and the graph failed on its first call.
    The constants are read again from the text, in order, and every one
    the parser got wrong is replaced."""
    graph = parse_ir(ir, tensor_constants=True)
    written = _TENSOR_CONSTANT.findall(ir)
    parsed = [node for node in graph.nodes() if node.kind() == "prim::Constant"
              and tensor_constant(node.output()) is not None]
    if len(written) != len(parsed):
        raise RewriteRefused(f"{len(written)} tensor constants written, {len(parsed)} parsed")
    for text, node in zip(written, parsed, strict=True):
        tensor = tensor_constant(node.output())
        value = _written_number(text)
        if tensor is None or value is None or tensor.numel() != 1 or tensor.item() == value:
            continue
        fixed = torch.full(tensor.shape, value, dtype=tensor.dtype)
        if fixed.item() != value:  # not a value of its dtype: leave it to fail as it did
            continue
        with graph.insert_point_guard(node):
            constant = graph.insertConstant(fixed)
        node.output().replaceAllUsesWith(constant)
        node.destroy()
    return graph


def _written_number(text: str) -> int | float | None:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
