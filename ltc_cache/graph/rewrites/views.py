"""View copies back to views (:func:`views_for_copies`, with the views a
graph returns and the layout of its outputs), and the ``arange`` into a
stored tensor that would keep a graph from it (:func:`functional_aranges`)."""

from __future__ import annotations

from ...entries.layout import Source
from ...errors import WrongType
from ..torchscript_ir import Graph, Node, TensorType, Value
from .ir import (
    CONTAINERS,
    may_write,
    nodes_calling,
    op_facts,
    reads_values_only,
    stored_constants,
    swap_in,
    take_place,
)

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


def functional_aranges(graph: Graph, inputs: list[Source]) -> int:
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
    stored = stored_constants(graph, inputs)
    replaced = 0
    for node in nodes_calling(graph, "aten::arange.start_out"):
        start, end, step, out = node.inputs()
        tensor = stored.get(out.unique())
        if tensor is None:
            continue
        with graph.insert_point_guard(node):
            none = graph.insertConstant(None)
            args = [start, end, step, graph.insertConstant(tensor.dtype), none,
                    graph.insertConstant(tensor.device), none]
        replaced += swap_in(graph, node, "aten::arange", args, "aten::arange.start_step")
    return replaced


def views_for_copies(graph: Graph) -> int:
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
    if any(may_write(n) for n in nodes):
        return 0
    views: set[int] = set()  # Value.unique() of the new views
    for node in nodes:
        op = op_facts(node)
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


def _root(value: Value) -> Value:
    """What ``value`` may share memory with: followed back through views and
    view copies alike."""
    while True:
        op = op_facts(value.node())
        if op is None or not (op.name in VIEW_OF_COPY or op.name in _VIEW_OPS):
            return value
        value = next(value.node().inputs())


def _returned_views(graph: Graph) -> set[int]:
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
        op = op_facts(node)
        if op is None or op.name not in _WHOLE_VIEWS:
            continue
        root = _root(value)
        made = op_facts(root.node())
        if made is None or made.aliases or made.writes or roots[root.unique()] != 1 \
                or not _view_is_safe(node, returned=True):
            continue
        view = _replace_with_view(graph, node, VIEW_OF_COPY[op.name])
        if view is not None:
            new.add(view.output().unique())
    return new


def _view_is_safe(node: Node, *, returned: bool = False) -> bool:
    """Whether every use of ``node`` takes a view as it took the copy;
    ``returned``: the graph's return counts as such a use."""
    for use in node.output().uses():
        user = use.user
        if user.kind() == "prim::Return":
            if returned:
                continue
            return False
        if user.kind() in CONTAINERS:
            if not all(reads_values_only(u.user) for u in user.output().uses()):
                return False
        elif not (_is_view_copy(user) or reads_values_only(user)):
            return False
    return True


# Ops whose result is a new contiguous tensor whatever the layout of their
# inputs: what they compute from a view is laid out as it was from a copy.
_NEW_LAYOUT = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::mv",
                         "aten::addmv", "aten::dot"})


def _keep_output_layouts(graph: Graph, views: set[int], returned: set[int]) -> None:
    """Make contiguous each graph output whose layout may follow a new view,
    and hand back each of ``returned`` (views the graph returns) through
    ``_unsafe_view``: the same memory, but no view to autograd, which
    refuses an in-place change of a view that an ``autograd.Function``
    (AOTAutograd's, or :class:`~ltc_cache.compile_backend.joint.JointFunction`) returns."""
    follows = set(views)
    for node in graph.nodes():
        if node.kind() not in _NEW_LAYOUT and \
                any(v.unique() in follows for v in node.inputs()):
            follows.update(out.unique() for out in node.outputs())
    ret = graph.return_node()
    for i, value in enumerate(list(ret.inputs())):
        if value.unique() not in follows:
            continue
        if not isinstance(value.type(), TensorType):
            raise WrongType(f"graph output {i} of type {value.type()} computed from a view")
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


def _is_view_copy(node: Node) -> bool:
    op = op_facts(node)
    return op is not None and op.name in VIEW_OF_COPY


def _replace_with_view(graph: Graph, node: Node,
                       target: str) -> Node | None:
    """Put the view ``target`` in place of ``node``; None (``node`` kept)
    where the view op would not take the same arguments."""
    kind = target.split(".")[0]
    view = graph.create(kind, list(node.inputs()), 1)
    view.insertBefore(node)
    new, old = op_facts(view), op_facts(node)
    if new is None or new.name != target or new.arg_types != old.arg_types:
        view.destroy()
        return None
    take_place(node, view.output())
    return view
