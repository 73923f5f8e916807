"""Captured scalars made numbers in the IR: unwrapped 0-dim constants
folded (:func:`fold_scalars`), tensor exponents made numbers
(:func:`scalar_exponents`), and ``bool[]`` constants written so that they
read back (:func:`bool_list_constants`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...entries.layout import Source
from ..torchscript_ir import BoolType, Graph, JitType, ListType, Value
from .ir import (
    is_real_dtype,
    nodes_calling,
    scalar_value,
    stored_constants,
    swap_in,
    take_place,
    tensor_constant,
)

# Ops that unwrap a one-element tensor into a number, and which dtypes each
# accepts.
_UNWRAP: dict[str, Callable[[torch.dtype], bool]] = {
    "aten::ScalarImplicit": lambda dtype: not dtype.is_complex,
    "aten::IntImplicit": lambda dtype: not dtype.is_floating_point and not dtype.is_complex
    and dtype != torch.bool,
    "aten::FloatImplicit": lambda dtype: dtype.is_floating_point,
}


def fold_scalars(graph: Graph, inputs: list[Source]) -> int:
    """Replace ``aten::ScalarImplicit`` (and ``IntImplicit``,
    ``FloatImplicit``) of a stored 0-dim constant input, or of a one-element
    tensor constant in the IR, with an IR constant of its value; returns how
    many. A constant input goes when nothing else reads it (see
    :func:`drop_dead_code`).

    LTC passes captured scalars (``alpha=1``, ``x * 2.5``) as 0-dim tensor
    inputs and writes slice bounds as tensor constants, which
    ``torch._C.parse_ir`` refuses by default: folding them makes every call
    cheaper and a sliced graph's IR parse. A float folds only where the IR
    text carries it exactly (finite values print with 17 significant
    digits); complex and non-finite values stay.
    """
    stored = {k: t for k, t in stored_constants(graph, inputs).items() if t.dim() == 0}
    folded = 0
    resolved: dict[tuple[Any, ...], str] = {}
    for node in list(graph.nodes()):
        accepts = _UNWRAP.get(node.kind())
        if accepts is None:
            continue
        value = _number_of(node.inputsAt(0), stored, accepts)
        if value is None:
            continue
        with graph.insert_point_guard(node):
            constant = graph.insertConstant(value)
        if not _same_overloads(graph, node.output(), constant, resolved):
            constant.node().destroy()
            continue
        node.output().replaceAllUsesWith(constant)
        node.destroy()
        folded += 1
    return folded


def scalar_exponents(graph: Graph, inputs: list[Source]) -> int:
    """Replace ``pow.Tensor_Tensor(x, e)`` whose exponent ``e`` is a stored
    0-dim constant (a captured ``x.pow(2)``, RMSNorm's square) with
    ``pow.Tensor_Scalar(x, value)``; returns how many.

    LTC captures the exponent as a 0-dim tensor, and ATen's tensor-exponent
    kernel calls ``pow`` per element, while the scalar-exponent kernel that
    eager runs for ``x.pow(2)`` squares: measured ~10x faster on a
    (2, 128, 256) float tensor. The result type is the same, as a 0-dim
    tensor and a number take part in type promotion alike; the values are
    eager's own (the tensor-exponent kernel differs from it by up to an ulp).
    Integer and floating exponents only.
    """
    stored = {k: t for k, t in stored_constants(graph, inputs).items() if t.dim() == 0}
    replaced = 0
    for node in nodes_calling(graph, "aten::pow.Tensor_Tensor"):
        base, exponent = node.inputs()
        value = _number_of(exponent, stored, is_real_dtype)
        if value is None:
            continue
        with graph.insert_point_guard(node):
            exponent_value = graph.insertConstant(value)
        replaced += swap_in(graph, node, "aten::pow", [base, exponent_value],
                            "aten::pow.Tensor_Scalar")
    return replaced


def _same_overloads(graph: Graph, old: Value, new: Value,
                    resolved: dict[tuple[Any, ...], str]) -> bool:
    """Whether every op reading ``old`` resolves to the same overload when it
    reads ``new`` instead (an int where a Scalar stood can pick another:
    ``add(Scalar, Scalar)`` becomes ``add.int``). ``resolved`` memoises
    resolutions, which depend on the op and its input types only."""
    for use in old.uses():
        user = use.user
        inputs = list(user.inputs())
        swapped = [new if v.unique() == old.unique() else v for v in inputs]
        before = _overload(graph, user.kind(), inputs, user.outputsSize(), resolved)
        if before == "(no schema)" or before != _overload(graph, user.kind(), swapped,
                                                          user.outputsSize(), resolved):
            return False
    return True


def _overload(graph: Graph, kind: str, inputs: list[Value], outputs: int,
              resolved: dict[tuple[Any, ...], str]) -> str:
    key = (kind, outputs, *(str(v.type()) for v in inputs))
    if key not in resolved:
        # Resolved on a detached probe node: a node caches the overload it
        # first resolved, so asking the user itself could answer stale.
        probe = graph.create(kind, inputs, outputs)
        try:
            resolved[key] = probe.schema()
        finally:
            probe.destroy()
    return resolved[key]


def _number_of(value: Value, stored: dict[int, torch.Tensor],
               accepts: Callable[[torch.dtype], bool]) -> bool | int | float | None:
    """The number a one-element tensor holds, where ``value`` is a stored
    0-dim constant or a tensor constant in the IR of a dtype ``accepts``;
    else None (and for a non-finite or complex number)."""
    tensor = stored.get(value.unique())
    if tensor is None:
        tensor = tensor_constant(value)
    if tensor is None or tensor.numel() != 1 or not accepts(tensor.dtype):
        return None
    return scalar_value(tensor)


def bool_list_constants(graph: Graph) -> int:
    """Rebuild each ``bool[]`` constant as a ``prim::ListConstruct`` of bool
    constants; returns how many.

    LTC's lowering writes ``bool[]`` constants (``output_mask`` of
    ``native_layer_norm_backward``), and ``torch._C.parse_ir`` reads them
    back as lists of ints, which the op then rejects ("Expected BoolList but
    got GenericList"): the stored IR would not run in any process. A list
    built from bool constants reads back as it was written.
    """
    rebuilt = 0
    for node in list(graph.nodes()):
        if node.kind() != "prim::Constant" or not _is_bool_list(node.output().type()):
            continue
        values = node.output().toIValue()
        with graph.insert_point_guard(node):
            items = [graph.insertConstant(bool(v)) for v in values]
            construct = graph.insertNode(graph.create("prim::ListConstruct", items, 1))
        take_place(node, construct.output())
        rebuilt += 1
    return rebuilt


def _is_bool_list(t: JitType) -> bool:
    return isinstance(t, ListType) and isinstance(t.getElementType(), BoolType)
