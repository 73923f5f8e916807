"""Rewrites of a traced graph's IR, applied once at trace time, before the
entry is stored, so that every process that loads the entry gains.

LTC's TorchScript backend lowers every view op to a copy (``t_copy``,
``view_copy`` ...), so each call copies every weight it transposes, and it
passes each captured scalar (``addmm``'s alpha and beta, ``add``'s alpha) as
a 0-dim tensor graph input that an ``aten::ScalarImplicit`` node unwraps at
every call. Three small rewrites remove that work:

- :func:`functional_aranges`: ``arange`` into a stored ``out`` tensor (how
  LTC writes a position index) becomes the ``arange`` that allocates, so
  that the graph writes no memory and the next rewrite may run;
- :func:`views_for_copies`: a view copy becomes the view it copies, where no
  op in the graph writes to memory, the view is only read by ops that read
  values (not strides), and no output shares memory or changes layout;
- :func:`fold_scalars`: ``ScalarImplicit`` of a stored 0-dim constant (or
  of a tensor constant in the IR) becomes an IR constant, and the constant
  input goes from the layout;
- :func:`scalar_exponents`: ``pow`` of a stored 0-dim exponent becomes
  ``pow`` of a number, the overload eager runs for ``x.pow(2)`` and ten
  times faster (RMSNorm's square);
- :func:`tanh_gelus`: GELU's tanh approximation written out as eight
  elementwise ops (GPT-2's) becomes ATen's one-pass ``gelu``;
- :func:`silu_backwards`: the chain of six ops LTC lowers ``silu_backward``
  to (Llama's backward) becomes that one fused op again;
- :func:`drop_dead_code`: nodes and graph inputs nothing reads.

One shortens the graph, which a warm start pays for by the node
(:func:`linears`: a product with a transposed weight, ``addmm(b, x,
w.t())`` or ``mm(x, w.t())``, becomes the ``linear`` that runs exactly
that product, one node where there were two), and one makes the stored
text mean what LTC built (:func:`bool_list_constants`).

Each works on a parsed graph and the input layout in place; :func:`rewrite`
applies them to an :class:`~ltc_cache.extract.Extraction` and keeps the
traced IR where anything fails, since a rewrite is an optimisation only.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import re
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from .diagnostics import warn_once
from .extract import Extraction
from .layout import Source

__all__ = ["VIEW_OF_COPY", "bool_list_constants", "drop_dead_code", "fold_scalars",
           "functional_aranges", "linears", "rewrite", "scalar_exponents", "silu_backwards",
           "tanh_gelus", "views_for_copies"]

logger = logging.getLogger("ltc_cache.rewrite")

# A copy op (with overload) -> the view op whose result it copies; the two
# take the same arguments. ``view_copy`` becomes ``reshape``, not ``view``:
# ``view_copy`` accepts inputs that cannot be viewed (it copies them), and so
# does ``reshape``, while ``view`` would raise on a non-contiguous input that
# another rewritten view hands it. ``as_strided_copy`` stays: its strides
# address the storage, which a view's input no longer starts.
VIEW_OF_COPY: dict[str, str] = {
    "aten::alias_copy": "aten::alias",
    "aten::detach_copy": "aten::detach",
    "aten::diagonal_copy": "aten::diagonal",
    "aten::expand_copy": "aten::expand",
    "aten::narrow_copy": "aten::narrow",
    "aten::permute_copy": "aten::permute",
    "aten::select_copy.int": "aten::select.int",
    "aten::slice_copy.Tensor": "aten::slice.Tensor",
    "aten::squeeze_copy": "aten::squeeze",
    "aten::squeeze_copy.dim": "aten::squeeze.dim",
    "aten::squeeze_copy.dims": "aten::squeeze.dims",
    "aten::t_copy": "aten::t",
    "aten::transpose_copy.int": "aten::transpose.int",
    "aten::unfold_copy": "aten::unfold",
    "aten::unsqueeze_copy": "aten::unsqueeze",
    "aten::view_copy": "aten::reshape",
}

# Ops that read an input's strides or storage rather than its values, or
# reject some layouts: a view (non-contiguous, offset, stride 0) must not
# reach them where a fresh contiguous copy did.
_LAYOUT_READERS = ("as_strided", "_reshape_alias", "_unsafe_view", "view_as_real",
                   "view_as_complex", "view_copy.dtype", "contiguous", "stride",
                   "_nested", "data_ptr", "set_")

# Nodes without a schema that only build or take apart containers.
_CONTAINERS = frozenset({"prim::ListConstruct", "prim::TupleConstruct"})
_STRUCTURAL = _CONTAINERS | {"prim::Constant", "prim::ListUnpack", "prim::TupleUnpack"}


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
    schema = torch._C.parse_schema(schema_text)
    name = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
    aliases = any(a.alias_info is not None for a in (*schema.arguments, *schema.returns))
    writes = schema.is_mutable or any(a.alias_info is not None and a.alias_info.is_write
                                      for a in schema.arguments)
    layout = any(marker in name for marker in _LAYOUT_READERS)
    return _Op(name, aliases, writes, not aliases and not layout,
               tuple(str(a.type) for a in schema.arguments))


def _op(node: torch._C.Node) -> _Op | None:
    return _op_of(node.schema())


def _calls(graph: torch._C.Graph, name: str) -> list[torch._C.Node]:
    """The nodes of ``graph`` that call op ``name`` (with its overload),
    listed before a rewrite replaces any."""
    return [node for node in graph.nodes() if (op := _op(node)) is not None and op.name == name]


def _writes(node: torch._C.Node) -> bool:
    """Whether ``node`` may write to memory it did not allocate (or is an
    op this module does not know, which is treated the same)."""
    kind = node.kind()
    if kind in _STRUCTURAL:
        return False
    if kind.startswith("prim::"):  # control flow (blocks) and the like
        return True
    op = _op(node)
    return op is None or op.writes


def _reads_values_only(node: torch._C.Node) -> bool:
    """Whether ``node`` reads its tensor inputs as values: its result neither
    aliases them nor depends on their strides."""
    op = _op(node)
    return op is not None and op.reads_values_only


def functional_aranges(graph: torch._C.Graph, inputs: list[Source]) -> int:
    """Replace ``arange.start_out(start, end, step, out)`` whose ``out`` is a
    stored constant with ``arange.start_step(start, end, step, dtype=,
    device=)`` of that constant's dtype and device; returns how many.

    LTC lowers ``torch.arange`` (a transformer's position ids) to the ``out=``
    form over an empty tensor it stores with the entry. That op writes
    memory, so :func:`views_for_copies` left every graph holding one whole,
    its weights copied on every call. The allocating form runs the same
    kernel on a new tensor of the same dtype (``at::arange`` allocates, then
    calls ``arange_out``): the same values, and no output shares a stored
    constant's memory any more. The constant goes when nothing else reads it
    (see :func:`drop_dead_code`).
    """
    stored = _stored_constants(graph, inputs)
    replaced = 0
    for node in _calls(graph, "aten::arange.start_out"):
        start, end, step, out = node.inputs()
        tensor = stored.get(out.unique())
        if tensor is None:
            continue
        with graph.insert_point_guard(node):
            none = graph.insertConstant(None)
            args = [start, end, step, graph.insertConstant(tensor.dtype), none,
                    graph.insertConstant(tensor.device), none]
        replaced += _swap_in(graph, node, "aten::arange", args, "aten::arange.start_step")
    return replaced


def views_for_copies(graph: torch._C.Graph) -> int:
    """Turn view copies into views where that is provably safe; returns how
    many.

    Safe means every output has the values, the layout and the (lack of)
    sharing it had with the copies:

    - no node of the graph writes to memory (LTC's graphs are functional;
      one that is not is left whole), so no value can change under a view;
    - each use of a new view reads values only (an op without alias
      annotations and not reading strides), is another view copy (which
      accepts any layout), or builds a container only such ops read; values
      are the same up to the order in which a kernel accumulates for a
      layout;
    - a view copy the graph returns stays a copy, so no output shares
      memory with an input, a weight, a stored constant or another output
      (overwriting one changes nothing else, and the wrapper's copy of an
      updated value into its argument never reads what it writes), unless
      what it views is a tensor the graph computed that no other output
      shares (:func:`_returned_views`): that memory is the output's alone;
    - an output computed from a new view by an op that keeps its input's
      layout (``x.t() + 1``) is made contiguous, as the copy made it: LTC
      drops ``.contiguous()``, so a model's ``x.t().contiguous() * 2`` is
      ``t_copy`` then ``mul`` in the IR, and its caller may ``view`` it.
    """
    nodes = list(graph.nodes())
    if any(_writes(n) for n in nodes):
        return 0
    views: set[int] = set()  # Value.unique() of the new views
    for node in nodes:
        op = _op(node)
        target = VIEW_OF_COPY.get(op.name) if op is not None else None
        if target is not None and _view_is_safe(node):
            view = _replace_with_view(graph, node, target)
            if view is not None:
                views.add(view.output().unique())
    returned = _returned_views(graph)
    views |= returned
    if views:
        _keep_output_layouts(graph, views, returned)
    return len(views)


# View copies whose result holds every element of what they view (expand
# some twice): returned as views, they keep no memory alive that a copy of
# theirs would not have held (unlike ``select`` or ``slice``).
_WHOLE_VIEWS = frozenset({
    "aten::alias_copy", "aten::detach_copy", "aten::expand_copy", "aten::permute_copy",
    "aten::squeeze_copy", "aten::squeeze_copy.dim", "aten::squeeze_copy.dims", "aten::t_copy",
    "aten::transpose_copy.int", "aten::unsqueeze_copy", "aten::view_copy"})


_VIEW_OPS = frozenset(VIEW_OF_COPY.values())


def _root(value: torch._C.Value) -> torch._C.Value:
    """What ``value`` may share memory with: followed back through views and
    view copies alike."""
    while True:
        op = _op(value.node())
        if op is None or not (op.name in VIEW_OF_COPY or op.name in _VIEW_OPS):
            return value
        value = next(value.node().inputs())


def _returned_views(graph: torch._C.Graph) -> set[int]:
    """Turn into views the view copies the graph returns whose root
    (:func:`_root`) is a tensor an op of the graph allocated, and which no
    other output shares; returns the new views' values, which
    :func:`_keep_output_layouts` makes contiguous as the copies were (a copy
    only where the view is not laid out so: a weight gradient that a
    backward computes as ``t(t(mm))`` and a ``view`` to the same shape cost
    nothing) and no views.

    The output then owns that memory, as it owned its copy: nothing else
    the caller gets holds it, and the graph writes nothing."""
    ret = graph.return_node()
    roots: dict[int, int] = {}
    for value in ret.inputs():
        root = _root(value).unique()
        roots[root] = roots.get(root, 0) + 1
    new: set[int] = set()
    for value in dict.fromkeys(ret.inputs()):  # each value once, in order
        node = value.node()
        op = _op(node)
        if op is None or op.name not in _WHOLE_VIEWS:
            continue
        root = _root(value)
        made = _op(root.node())
        if made is None or made.aliases or made.writes or roots[root.unique()] != 1 \
                or not _view_is_safe(node, returned=True):
            continue
        view = _replace_with_view(graph, node, VIEW_OF_COPY[op.name])
        if view is not None:
            new.add(view.output().unique())
    return new


def _view_is_safe(node: torch._C.Node, *, returned: bool = False) -> bool:
    """Whether every use of ``node`` takes a view as it took the copy;
    ``returned``: the graph's return counts as such a use."""
    for use in node.output().uses():
        user = use.user
        if user.kind() == "prim::Return":
            if returned:
                continue
            return False
        if user.kind() in _CONTAINERS:
            if not all(_reads_values_only(u.user) for u in user.output().uses()):
                return False
        elif not (_is_view_copy(user) or _reads_values_only(user)):
            return False
    return True


# Ops whose result is a new contiguous tensor whatever the layout of their
# inputs: what they compute from a view is laid out as it was from a copy.
_NEW_LAYOUT = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::mv",
                         "aten::addmv", "aten::dot"})


def _keep_output_layouts(graph: torch._C.Graph, views: set[int], returned: set[int]) -> None:
    """Make contiguous each graph output whose layout may follow a new view,
    and hand back each of ``returned`` (views the graph returns) through
    ``_unsafe_view``: the same memory, but no view to autograd, which
    refuses an in-place change of a view that an ``autograd.Function``
    (AOTAutograd's, or :class:`~ltc_cache.joint.JointFunction`) returns."""
    follows = set(views)
    for node in graph.nodes():
        if node.kind() not in _NEW_LAYOUT and \
                any(v.unique() in follows for v in node.inputs()):
            follows.update(out.unique() for out in node.outputs())
    ret = graph.return_node()
    for i, value in enumerate(list(ret.inputs())):
        if value.unique() not in follows:
            continue
        if not isinstance(value.type(), torch._C.TensorType):
            raise TypeError(f"graph output {i} of type {value.type()} computed from a view")
        with graph.insert_point_guard(ret):
            contiguous_format = graph.insertConstant(0)  # MemoryFormat is an int in the IR
            node = graph.insertNode(graph.create("aten::contiguous",
                                                 [value, contiguous_format], 1))
        node.output().setType(value.type())
        out = node.output()
        if value.unique() in returned:
            with graph.insert_point_guard(ret):
                out = graph.insert("aten::_unsafe_view", [out, graph.insert("aten::size", [out])])
            out.setType(value.type())
        ret.replaceInput(i, out)


def _is_view_copy(node: torch._C.Node) -> bool:
    op = _op(node)
    return op is not None and op.name in VIEW_OF_COPY


def _replace_with_view(graph: torch._C.Graph, node: torch._C.Node,
                       target: str) -> torch._C.Node | None:
    """Put the view ``target`` in place of ``node``; None (``node`` kept)
    where the view op would not take the same arguments."""
    kind = target.split(".")[0]
    view = graph.create(kind, list(node.inputs()), 1)
    view.insertBefore(node)
    new, old = _op(view), _op(node)
    if new is None or new.name != target or new.arg_types != old.arg_types:
        view.destroy()
        return None
    _take_place(node, view.output())
    return view


def _take_place(node: torch._C.Node, value: torch._C.Value) -> None:
    """``value`` stands in for ``node``'s single output, with its type, and
    ``node`` goes."""
    value.setType(node.output().type())
    node.output().replaceAllUsesWith(value)
    node.destroy()


def _swap_in(graph: torch._C.Graph, node: torch._C.Node, kind: str,
             inputs: list[torch._C.Value], overload: str) -> bool:
    """Put a ``kind`` node reading ``inputs`` in ``node``'s place if it
    resolves to ``overload``; whether it did (else the graph is as it was,
    but for constants made for it, which :func:`drop_dead_code` removes)."""
    with graph.insert_point_guard(node):
        new = graph.insertNode(graph.create(kind, inputs, 1))
    made = _op(new)
    if made is None or made.name != overload:
        new.destroy()
        return False
    _take_place(node, new.output())
    return True


def _stored_constants(graph: torch._C.Graph, inputs: list[Source]) -> dict[int, torch.Tensor]:
    """The tensors stored with the entry, by the ``unique()`` of the graph
    input they are bound to."""
    params = list(graph.inputs())
    return {params[i].unique(): s.ref for i, s in enumerate(inputs)
            if s.kind == "const" and isinstance(s.ref, torch.Tensor)}


# Ops that unwrap a one-element tensor into a number, and which dtypes each
# accepts.
_UNWRAP: dict[str, Callable[[torch.dtype], bool]] = {
    "aten::ScalarImplicit": lambda dtype: not dtype.is_complex,
    "aten::IntImplicit": lambda dtype: not dtype.is_floating_point and not dtype.is_complex
    and dtype != torch.bool,
    "aten::FloatImplicit": lambda dtype: dtype.is_floating_point,
}


def fold_scalars(graph: torch._C.Graph, inputs: list[Source]) -> int:
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
    stored = {k: t for k, t in _stored_constants(graph, inputs).items() if t.dim() == 0}
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


def scalar_exponents(graph: torch._C.Graph, inputs: list[Source]) -> int:
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
    stored = {k: t for k, t in _stored_constants(graph, inputs).items() if t.dim() == 0}
    replaced = 0
    for node in _calls(graph, "aten::pow.Tensor_Tensor"):
        base, exponent = node.inputs()
        value = _number_of(exponent, stored, _real_dtype)
        if value is None:
            continue
        with graph.insert_point_guard(node):
            exponent_value = graph.insertConstant(value)
        replaced += _swap_in(graph, node, "aten::pow", [base, exponent_value],
                             "aten::pow.Tensor_Scalar")
    return replaced


class _Matcher:
    """Questions the chain rewrites ask of a value: which op made it, which
    number it holds (an IR constant or a stored 0-dim constant), and what
    it is the product or the sum of."""

    def __init__(self, graph: torch._C.Graph, inputs: list[Source]) -> None:
        self.stored = {k: t for k, t in _stored_constants(graph, inputs).items()
                       if t.dim() == 0}

    def number(self, value: torch._C.Value) -> float | None:
        if value.node().kind() == "prim::Constant":
            constant = value.toIValue()
            return constant if type(constant) in (int, float) else None
        tensor = self.stored.get(value.unique())
        return _scalar_value(tensor) if tensor is not None and _real_dtype(tensor.dtype) \
            else None

    def is_op(self, value: torch._C.Value, name: str) -> bool:
        op = _op(value.node())
        return op is not None and op.name == name

    def times(self, value: torch._C.Value, factor: float) -> torch._C.Value | None:
        """``t`` where ``value`` is ``t * factor`` (either order)."""
        pair = self.factors(value)
        if pair is None:
            return None
        for tensor, other in (pair, pair[::-1]):
            found = self.number(other)
            if found is not None and math.isclose(found, factor, rel_tol=1e-9):
                return tensor
        return None

    def plus(self, value: torch._C.Value) -> tuple[torch._C.Value, torch._C.Value] | None:
        """The two operands where ``value`` is ``a + b`` (alpha 1)."""
        if not self.is_op(value, "aten::add.Tensor"):
            return None
        a, b, alpha = value.node().inputs()
        return (a, b) if self.number(alpha) == 1 else None

    def factors(self, value: torch._C.Value) -> tuple[torch._C.Value, torch._C.Value] | None:
        """The two operands where ``value`` is ``a * b``."""
        if not self.is_op(value, "aten::mul.Tensor"):
            return None
        a, b = value.node().inputs()
        return a, b

    def filled_one(self, value: torch._C.Value) -> bool:
        """Whether ``value`` is a tensor of ones, as LTC writes it:
        ``clone(expand(c))`` of a stored 1."""
        if not self.is_op(value, "aten::clone"):
            return False
        expanded = value.node().inputsAt(0)
        return self.is_op(expanded, "aten::expand") \
            and self.number(expanded.node().inputsAt(0)) == 1


def silu_backwards(graph: torch._C.Graph, inputs: list[Source]) -> int:
    """Replace the chain LTC lowers ``silu_backward`` to, ``g * (s * (1 + x
    * (1 - s)))`` with ``s = sigmoid(x)`` and the 1 of ``1 - s`` a tensor of
    ones, with ``silu_backward(g, x)``; returns how many.

    SiLU is Llama's activation, and each op of the chain is a pass over the
    activation (the ones too) where eager's backward runs one fused
    kernel, the one put back here: its values are eager's (fact 15 in
    docs/design.md).
    """
    match = _Matcher(graph, inputs)

    def silu_backward_of(grad: torch._C.Value, product: torch._C.Value) -> list[Any] | None:
        x = _silu_input(match, product)
        return None if x is None else [grad, x]

    return _replace_products(graph, silu_backward_of, "aten::silu_backward")


def _silu_input(match: _Matcher, product: torch._C.Value) -> torch._C.Value | None:
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


def tanh_gelus(graph: torch._C.Graph, inputs: list[Source]) -> int:
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

    def gelu_of(half_x: torch._C.Value, one_plus: torch._C.Value) -> list[Any] | None:
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


def _replace_products(graph: torch._C.Graph,
                      find: Callable[[torch._C.Value, torch._C.Value], list[Any] | None],
                      op_name: str) -> int:
    """Put ``op_name(*args)`` in place of each product ``a * b`` for which
    ``find(a, b)`` (or ``find(b, a)``) gives the arguments, inserting at the
    product; returns how many."""
    replaced = 0
    for node in _calls(graph, "aten::mul.Tensor"):
        a, b = node.inputs()
        for pair in ((a, b), (b, a)):
            with graph.insert_point_guard(node):
                args = find(*pair)
            if args is not None:
                replaced += _swap_in(graph, node, op_name, args, op_name)
                break
    return replaced


def _same_overloads(graph: torch._C.Graph, old: torch._C.Value, new: torch._C.Value,
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


def _overload(graph: torch._C.Graph, kind: str, inputs: list[torch._C.Value], outputs: int,
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


# A tensor constant as LTC writes it: ``%3 : Long(...) =
# prim::Constant[value={-4095}]()``.
_TENSOR_CONSTANT_TEXT = re.compile(r" : \w+\([^)]*\) = prim::Constant\[value=\{([^}]*)\}\]")
_NUMBER = re.compile(r"-?[0-9][0-9.e+-]*")


def signed_constants(graph: torch._C.Graph, ir: str) -> int:
    """Give each one-element tensor constant the value ``ir`` writes;
    returns how many it changed.

    ``torch._C.parse_ir(..., parse_tensor_constants=True)`` reads
    ``{-4095}`` as 4095 (torch 2.13; fact 22 in docs/design.md): a slice
    bound out of range below (Mistral's sliding-window cache keeps
    ``keys[:, :, -4095:]``) became a bound past the end, and the replay
    returned an empty tensor where eager returned the whole one. The
    parser renames values, so constants are matched in the order both list
    them."""
    written = _TENSOR_CONSTANT_TEXT.findall(ir)
    parsed = [node for node in graph.nodes() if node.kind() == "prim::Constant"
              and node.outputsSize() == 1 and _tensor_constant(node.output()) is not None]
    if len(written) != len(parsed):
        raise ValueError(f"{len(written)} tensor constants written, {len(parsed)} parsed")
    changed = 0
    for text, node in zip(written, parsed, strict=True):
        tensor = _tensor_constant(node.output())
        if tensor is None or tensor.numel() != 1 or not _NUMBER.fullmatch(text.strip()):
            continue
        number = float(text) if tensor.dtype.is_floating_point else int(text)
        right = torch.tensor(number, dtype=tensor.dtype).reshape(tensor.shape)
        if torch.equal(right, tensor):
            continue
        with graph.insert_point_guard(node):
            constant = graph.insertConstant(right)
        node.output().replaceAllUsesWith(constant)
        node.destroy()
        changed += 1
    return changed


def _tensor_constant(value: torch._C.Value) -> torch.Tensor | None:
    node = value.node()
    if node.kind() != "prim::Constant" or not isinstance(value.type(), torch._C.TensorType):
        return None
    constant = value.toIValue()
    return constant if isinstance(constant, torch.Tensor) else None


def _real_dtype(dtype: torch.dtype) -> bool:
    return dtype != torch.bool and not dtype.is_complex


def _number_of(value: torch._C.Value, stored: dict[int, torch.Tensor],
               accepts: Callable[[torch.dtype], bool]) -> bool | int | float | None:
    """The number a one-element tensor holds, where ``value`` is a stored
    0-dim constant or a tensor constant in the IR of a dtype ``accepts``;
    else None (and for a non-finite or complex number)."""
    tensor = stored.get(value.unique())
    if tensor is None:
        tensor = _tensor_constant(value)
    if tensor is None or tensor.numel() != 1 or not accepts(tensor.dtype):
        return None
    return _scalar_value(tensor)


def _scalar_value(t: torch.Tensor) -> bool | int | float | None:
    value = t.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def bool_list_constants(graph: torch._C.Graph) -> int:
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
        _take_place(node, construct.output())
        rebuilt += 1
    return rebuilt


def _is_bool_list(t: torch._C.JitType) -> bool:
    return isinstance(t, torch._C.ListType) and isinstance(t.getElementType(), torch._C.BoolType)


def linears(graph: torch._C.Graph) -> int:
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
        op = _op(node)
        if op is not None and op.name == "aten::addmm":
            bias, x, weight_t, beta, alpha = node.inputs()
            if not (_is_one(beta) and _is_one(alpha)):
                continue
        elif op is not None and op.name == "aten::mm":
            x, weight_t = node.inputs()
            bias = None
        else:
            continue
        transpose = _op(weight_t.node())
        if transpose is None or transpose.name != "aten::t":
            continue
        if bias is None:
            with graph.insert_point_guard(node):
                bias = graph.insertConstant(None)
        # Always resolves (all are tensors); checked like the other swaps.
        replaced += _swap_in(graph, node, "aten::linear",
                             [x, weight_t.node().inputsAt(0), bias], "aten::linear")
    return replaced


def _is_one(value: torch._C.Value) -> bool:
    if value.node().kind() != "prim::Constant":
        return False
    constant = value.toIValue()
    return type(constant) in (int, float) and constant == 1


def drop_dead_code(graph: torch._C.Graph, inputs: list[Source]) -> int:
    """Remove nodes whose results nothing reads, merge equal constants, and
    remove graph inputs nothing reads with their entries in ``inputs``;
    returns how many nodes and inputs went."""
    before = sum(1 for _ in graph.nodes())
    torch._C._jit_pass_dce(graph)
    torch._C._jit_pass_constant_pooling(graph)
    removed = before - sum(1 for _ in graph.nodes())
    params = list(graph.inputs())
    for i in reversed(range(len(inputs))):
        if not params[i].uses():
            graph.eraseInput(i)
            del inputs[i]
            removed += 1
    return removed


def rewrite(extraction: Extraction) -> Extraction:
    """``extraction`` with its IR rewritten by every rewrite above and its
    input layout to match; the extraction unchanged where a rewrite fails or
    its result does not parse again."""
    if not extraction.ir:
        return extraction
    try:
        # LTC writes slice bounds as one-element tensor constants.
        graph = torch._C.parse_ir(extraction.ir, parse_tensor_constants=True)
        inputs = list(extraction.inputs)
        if len(inputs) != len(list(graph.inputs())):
            raise ValueError(f"{len(inputs)} inputs laid out for a graph of "
                             f"{len(list(graph.inputs()))}")
        signed = signed_constants(graph, extraction.ir)
        aranges = functional_aranges(graph, inputs)
        views = views_for_copies(graph)
        scalars = fold_scalars(graph, inputs)
        bool_lists = bool_list_constants(graph)
        products = linears(graph)
        powers = scalar_exponents(graph, inputs)
        gelus = tanh_gelus(graph, inputs)
        silus = silu_backwards(graph, inputs)
        dead = drop_dead_code(graph, inputs)
        ir = str(graph)
        # What the cache stores must parse in a new process, as replay parses.
        torch._C.parse_ir(ir)
    except Exception as exc:  # best effort: the traced IR is correct as it is
        warn_once("rewrite", f"cannot rewrite a traced graph ({type(exc).__name__}: {exc}); "
                  "storing it as traced")
        return extraction
    logger.debug("restored %d constants' signs, made %d aranges allocate, rewrote %d view "
                 "copies, folded %d scalars, rebuilt %d bool lists, made %d linears, "
                 "%d scalar powers, %d tanh GELUs and %d SiLU backwards, dropped %d dead "
                 "nodes/inputs", signed, aranges, views, scalars, bool_lists, products, powers,
                 gelus, silus, dead)
    return dataclasses.replace(extraction, ir=ir, inputs=tuple(inputs))
