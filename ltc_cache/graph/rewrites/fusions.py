"""Chains of elementwise ops back to the one fused op they compute: GELU's
tanh approximation (:func:`tanh_gelus`) and SiLU's backward
(:func:`silu_backwards`), matched by :class:`_Matcher` at a product."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ...entries.layout import Source
from ..torchscript_ir import Graph, Value
from .ir import is_real_dtype, nodes_calling, op_facts, scalar_value, stored_constants, swap_in


class _Matcher:
    """Questions the chain rewrites ask of a value: which op made it, which
    number it holds (an IR constant or a stored 0-dim constant), and what
    it is the product or the sum of."""

    def __init__(self, graph: Graph, inputs: list[Source]) -> None:
        self.stored = {k: t for k, t in stored_constants(graph, inputs).items()
                      if t.dim() == 0}

    def number(self, value: Value) -> float | None:
        if value.node().kind() == "prim::Constant":
            constant = value.toIValue()
            return constant if type(constant) in (int, float) else None
        tensor = self.stored.get(value.unique())
        return scalar_value(tensor) if tensor is not None and is_real_dtype(tensor.dtype) \
            else None

    def is_op(self, value: Value, name: str) -> bool:
        op = op_facts(value.node())
        return op is not None and op.name == name

    def times(self, value: Value, factor: float) -> Value | None:
        """``t`` where ``value`` is ``t * factor`` (either order)."""
        pair = self.factors(value)
        if pair is None:
            return None
        for tensor, other in (pair, pair[::-1]):
            found = self.number(other)
            if found is not None and math.isclose(found, factor, rel_tol=1e-9):
                return tensor
        return None

    def plus(self, value: Value) -> tuple[Value, Value] | None:
        """The two operands where ``value`` is ``a + b`` (alpha 1)."""
        if not self.is_op(value, "aten::add.Tensor"):
            return None
        a, b, alpha = value.node().inputs()
        return (a, b) if self.number(alpha) == 1 else None

    def factors(self, value: Value) -> tuple[Value, Value] | None:
        """The two operands where ``value`` is ``a * b``."""
        if not self.is_op(value, "aten::mul.Tensor"):
            return None
        a, b = value.node().inputs()
        return a, b

    def filled_one(self, value: Value) -> bool:
        """Whether ``value`` is a tensor of ones, as LTC writes it:
        ``clone(expand(c))`` of a stored 1."""
        if not self.is_op(value, "aten::clone"):
            return False
        expanded = value.node().inputsAt(0)
        return self.is_op(expanded, "aten::expand") \
            and self.number(expanded.node().inputsAt(0)) == 1


def silu_backwards(graph: Graph, inputs: list[Source]) -> int:
    """Replace the chain LTC lowers ``silu_backward`` to, ``g * (s * (1 + x
    * (1 - s)))`` with ``s = sigmoid(x)`` and the 1 of ``1 - s`` a tensor of
    ones, with ``silu_backward(g, x)``; returns how many.

    SiLU is Llama's activation, and each op of the chain is a pass over the
    activation (the ones too) where eager's backward runs one fused
    kernel, the one put back here: its values are eager's
    (docs/torch/ltc.md#fused-kernels-written-out-as-chains).
    """
    match = _Matcher(graph, inputs)

    def silu_backward_of(grad: Value, product: Value) -> list[Any] | None:
        x = _silu_input(match, product)
        return None if x is None else [grad, x]

    return _replace_products(graph, silu_backward_of, "aten::silu_backward")


def _silu_input(match: _Matcher, product: Value) -> Value | None:
    """``x`` where ``product`` is ``s * (1 + x * (1 - s))``, ``s =
    sigmoid(x)``, and no other op reads the chain between them."""
    factors = match.factors(product)
    if factors is None:
        return None
    for s, one_plus in (factors, factors[::-1]):
        if not match.is_op(s, "aten::sigmoid"):
            continue
        x = s.node().inputsAt(0)
        summed = match.plus(one_plus)
        if summed is None or match.number(summed[1]) != 1:
            continue
        scaled = match.factors(summed[0])
        if scaled is None or x.unique() not in (scaled[0].unique(), scaled[1].unique()):
            continue
        rest = scaled[1] if scaled[0].unique() == x.unique() else scaled[0]
        if not match.is_op(rest, "aten::sub.Tensor"):
            continue
        ones, sub_s, alpha = rest.node().inputs()
        if sub_s.unique() != s.unique() or match.number(alpha) != 1 \
                or not match.filled_one(ones):
            continue
        if any(len(v.uses()) != 1 for v in (product, one_plus, summed[0], rest, ones)):
            continue  # read elsewhere: the chain stays
        return x
    return None


# GELU's tanh approximation as GPT-2 writes it, 0.5 * x * (1 + tanh(BETA *
# (x + KAPPA * x ** 3))): the constants ATen's ``gelu(approximate="tanh")``
# computes with.
_GELU_BETA = math.sqrt(2 / math.pi)


_GELU_KAPPA = 0.044715


def tanh_gelus(graph: Graph, inputs: list[Source]) -> int:
    """Replace the chain of eight elementwise ops that computes GELU's tanh
    approximation (GPT-2's activation, written out in Python) with
    ``gelu(x, approximate="tanh")``; returns how many. The chain's nodes go
    where nothing else reads them (see :func:`drop_dead_code`).

    Each op of the chain is a pass over the activation and an allocation;
    ATen's tanh GELU is one vectorised pass of the same formula (on a
    (2, 128, 1024) float tensor 1.2 ms against 1.9-2.2 ms, one thread). Its
    values differ from the chain's by rounding only (a few ulp). Runs after
    :func:`scalar_exponents`, whose ``pow(x, 3)`` it matches.
    """
    match = _Matcher(graph, inputs)

    def gelu_of(half_x: Value, one_plus: Value) -> list[Any] | None:
        # 0.5 * x * (1 + tanh(BETA * (x + KAPPA * pow(x, 3))))
        x = match.times(half_x, 0.5)
        summed = match.plus(one_plus)
        if x is None or summed is None:
            return None
        tanh = next((v for v in summed if match.is_op(v, "aten::tanh")), None)
        if tanh is None or match.number(summed[1] if summed[0] is tanh else summed[0]) != 1:
            return None
        inner = match.times(tanh.node().inputsAt(0), _GELU_BETA)
        terms = match.plus(inner) if inner is not None else None
        if terms is None or x.unique() not in (terms[0].unique(), terms[1].unique()):
            return None
        kappa_cube = terms[1] if terms[0].unique() == x.unique() else terms[0]
        cube = match.times(kappa_cube, _GELU_KAPPA)
        if cube is None or not match.is_op(cube, "aten::pow.Tensor_Scalar") \
                or cube.node().inputsAt(0).unique() != x.unique() \
                or match.number(cube.node().inputsAt(1)) != 3:
            return None
        chain = [half_x, one_plus, tanh, tanh.node().inputsAt(0), inner, kappa_cube, cube]
        if any(len(v.uses()) != 1 for v in chain):
            return None  # an intermediate read elsewhere (saved for backward) stays
        return [x, graph.insertConstant("tanh")]

    return _replace_products(graph, gelu_of, "aten::gelu")


def _replace_products(graph: Graph,
                      find: Callable[[Value, Value], list[Any] | None],
                      op_name: str) -> int:
    """Put ``op_name(*args)`` in place of each product ``a * b`` for which
    ``find(a, b)`` (or ``find(b, a)``) gives the arguments, inserting at the
    product; returns how many."""
    replaced = 0
    for node in nodes_calling(graph, "aten::mul.Tensor"):
        a, b = node.inputs()
        for pair in ((a, b), (b, a)):
            with graph.insert_point_guard(node):
                args = find(*pair)
            if args is not None:
                replaced += swap_in(graph, node, op_name, args, op_name)
                break
    return replaced
