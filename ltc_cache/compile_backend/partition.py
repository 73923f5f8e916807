"""Split an aten graph into the regions LTC lowers and an eager rest.

What lowers (:class:`ltc_cache.compile_backend.support.OpSupport`) is fused into regions by
FX's capability-based partitioner; the rest stays in the parent graph, run
eagerly between the regions. A graph holding an op LTC cannot lower is
refused whole by the original extraction; partitioned, the rest of it still
runs in LTC.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import fx
from torch.fx.passes.operator_support import OperatorSupportBase

from ..fx_ops import OpOverload
from .buffer_writes import buffer_writes_as_one
from .nodes import node_value
from .region_cuts import split_where_inputs_die

if TYPE_CHECKING:  # FX's partitioner and the probes: only when partitioning
    from .support import OpSupport

__all__ = ["REGION_PREFIX", "Partitioned", "partition"]

# Submodule names of the regions: ltc_region_0, ltc_region_1, ...
REGION_PREFIX = "ltc_region_"


@dataclass(frozen=True)
class Partitioned:
    """``module`` calls each region as ``module.<region name>(*inputs)``; a
    region returns a tuple. Stored in a plan as it is (:mod:`ltc_cache.compile_backend.plan`),
    so that a warm start does not partition again."""

    module: fx.GraphModule
    regions: tuple[str, ...]  # submodule names, in graph order
    region_ops: Mapping[str, int]  # aten ops in each region
    total_ops: int  # aten ops in the whole graph
    eager_ops: Mapping[str, int]  # op -> count of those left outside regions


# Fewer elements than this, and a copy at a region's output costs less than
# the view taken eagerly from Python in the parent graph: on the tests' tiny
# BERT (views of 512 elements) leaving them out made a call 13-21% slower.
_MIN_VIEW_ELEMENTS = 1 << 14


def _large_view(node: fx.Node) -> bool:
    value = node_value(node)
    return node.op == "call_function" and isinstance(node.target, OpOverload) \
        and node.target.is_view and isinstance(value, torch.Tensor) \
        and value.numel() >= _MIN_VIEW_ELEMENTS


def _leave_out_trailing_views(nodes: dict[fx.Node, Any]) -> None:
    """Drop from a proposed region the view ops that only nodes outside it
    read, then the views only those read, and so on, in place.

    LTC lowers views to copies (docs/torch/ltc.md#views-are-lowered-to-copies), and a region's
    outputs keep their copies: a region that ended in the transposes that
    make attention's query, key and value heads returned each as a
    contiguous copy, for the fused attention op between regions to read.
    Left out, the region returns the tensor the views look at and the
    parent graph takes the views eagerly, which copies nothing. Only views
    go, so a region keeps the ops that made it worth a region, and only
    views of ``_MIN_VIEW_ELEMENTS`` or more, whose copy costs more than a
    view taken from Python. Views the graph returns stay, but for views of
    the graph's inputs (:func:`_views_input`): a training step's weight
    gradients come out of the backward through ``t``, and as views they
    made GPT-2's and BERT's steps 4-6% slower.
    """
    changed = True
    while changed:
        changed = False
        for node in list(nodes):
            if _large_view(node) and node.users and not any(
                    u in nodes or (u.op == "output" and not _views_input(node)
                                   and not _read_outside(node, nodes))
                    for u in node.users):
                del nodes[node]
                changed = True


def _read_outside(node: fx.Node, nodes: dict[fx.Node, Any]) -> bool:
    """Whether an op outside the region reads view ``node`` besides the
    graph's output: the view is taken in the parent graph for that op
    anyway, and returned from there it is no copy. A training forward
    returns attention's query, key and value heads for the backward and the
    fused attention op between regions reads them: in a region, each was a
    copy of the heads on every step (12 per step of the small GPT of
    BENCHMARKS.md), as eager's saved heads are views."""
    return any(u.op != "output" and u not in nodes for u in node.users)


def _views_input(node: fx.Node) -> bool:
    """Whether view ``node`` looks at one of the graph's inputs. A training
    forward returns such views for its backward (``t`` of each weight a
    product reads): taken in the parent graph they are views of the
    weights, as AOTAutograd saves them, where a region returned a copy of
    every weight on every step."""
    return bool(node.args) and isinstance(node.args[0], fx.Node) \
        and node.args[0].op == "placeholder"


def _return_input_views_apart(graph: fx.Graph) -> None:
    """Give the graph's output its own node for each large view of a graph
    input that other nodes read too, in place: a training forward reads
    ``t`` of a weight for its product and returns it for the backward. The
    region keeps the view it reads (a view there, not a copy) and the twin
    leaves it (:func:`_leave_out_trailing_views`;
    docs/torch/aot-autograd.md#saved-transposed-weight-is-a-view)."""
    output = next(node for node in reversed(graph.nodes) if node.op == "output")
    for node in list(graph.nodes):
        if len(node.users) > 1 and output in node.users and _large_view(node) \
                and _views_input(node):
            with graph.inserting_before(output):
                twin = graph.call_function(node.target, node.args, node.kwargs)
            twin.meta = dict(node.meta)
            output.replace_input_with(node, twin)


# Views whose twin is taken in the parent graph (:func:`_views_apart_at_edges`),
# and the op the twin runs: ``view`` becomes ``reshape``, which takes any
# layout (a region's input may be laid out otherwise than AOTAutograd traced
# it, docs/torch/ltc.md#flash-attention-output-follows-query-layout), and is a view of a contiguous
# tensor.
_aten = torch.ops.aten
_TWIN_OF: dict[Any, Any] = {
    _aten.view.default: _aten.reshape.default,
    _aten._unsafe_view.default: _aten.reshape.default,
    _aten.t.default: _aten.t.default,
    _aten.transpose.int: _aten.transpose.int,
    _aten.permute.default: _aten.permute.default,
    _aten.unsqueeze.default: _aten.unsqueeze.default,
    _aten.expand.default: _aten.expand.default,
    _aten.detach.default: _aten.detach.default,
}
# Twins a graph's output may read: they keep a contiguous tensor contiguous
# (a transposed weight gradient handed to the optimizer made steps slower,
# :func:`_leave_out_trailing_views`).
_RETURNABLE_TWINS = frozenset({_aten.view.default, _aten._unsafe_view.default,
                               _aten.detach.default})


def _views_apart_at_edges(graph: fx.Graph, nodes: dict[fx.Node, Any]) -> None:
    """Give the readers outside a proposed region of each large view inside
    it a twin of the view taken in the parent graph, in place.

    The region returned such a view as a copy on every call (LTC lowers
    views to copies, docs/torch/ltc.md#views-are-lowered-to-copies): in a training backward the
    ``view`` of each activation gradient a product reads, which the weight
    gradients' products in a later region read too (12 copies of 256 KB a
    step of the small GPT of BENCHMARKS.md); in its forward the view of
    attention's output the backward's product reads, and the ``detach`` of
    it the attention backward reads. With the twin, the region returns the
    tensor the view chain starts from (its own input, or a tensor it
    computed: no copy) and keeps its view where it reads it. A chain that
    starts at a view of another kind inside the region stays."""
    for node in list(nodes):
        if node not in nodes or node.target not in _TWIN_OF or not _large_view(node) \
                or not isinstance(node.args[0], fx.Node):
            continue
        outside = [u for u in node.users if u not in nodes and (
            u.op != "output" or node.target in _RETURNABLE_TWINS)]
        if not outside:
            continue
        chain = [node]
        while chain[-1].args[0] in nodes and chain[-1].args[0].target in _TWIN_OF:
            chain.append(chain[-1].args[0])
        root = chain[-1].args[0]
        if root in nodes and getattr(root.target, "is_view", False):
            continue
        if len(outside) == len(node.users) and len(chain) == 1:
            del nodes[node]  # read outside only: it leaves the region whole
            continue
        twin = root
        with graph.inserting_after(node):
            for view in reversed(chain):
                twin = graph.call_function(_TWIN_OF[view.target], (twin, *view.args[1:]),
                                           view.kwargs)
                twin.meta = dict(view.meta)
        for user in outside:
            user.replace_input_with(node, twin)


def _graph_order(gm: fx.GraphModule) -> dict[fx.Node, int]:
    return {node: i for i, node in enumerate(gm.graph.nodes)}


class _Outside(OperatorSupportBase):
    """``support``, but for ``eager``: nodes that must run in the parent graph."""

    def __init__(self, support: OperatorSupportBase, eager: set[fx.Node]) -> None:
        self._support = support
        self._eager = eager

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module],
                          node: fx.Node) -> bool:
        return node not in self._eager and self._support.is_node_supported(submodules, node)


def _strided_views(graph: fx.Graph, eager_strided: Callable[[fx.Node], bool]) -> set[fx.Node]:
    """The views an ``as_strided`` left eager reads through (``eager_strided``
    says which are), back to the tensor they view, and that tensor where
    eager's is not contiguous: eager's strides address its storage, so it
    must be laid out as eager lays it out. A region's outputs are
    contiguous, and views taken in the parent keep eager's layout
    (docs/torch/ltc.md#ltc-as-strided-strides-elements)."""
    eager: set[fx.Node] = set()
    for node in graph.nodes:
        if node.op != "call_function" or not eager_strided(node):
            continue
        source = node.args[0]
        while isinstance(source, fx.Node) and source.op == "call_function" \
                and getattr(source.target, "is_view", False):
            eager.add(source)
            source = source.args[0]
        if isinstance(source, fx.Node) and source.op == "call_function":
            value = node_value(source)
            if isinstance(value, torch.Tensor) and not value.is_contiguous():
                eager.add(source)
    return eager


def _components(nodes: dict[fx.Node, Any]) -> list[list[fx.Node]]:
    """The weakly connected parts of a proposed region, each in graph order."""
    seen: set[fx.Node] = set()
    parts = []
    for start in nodes:
        if start in seen:
            continue
        seen.add(start)
        part, stack = [], [start]
        while stack:
            node = stack.pop()
            part.append(node)
            for other in (*node.all_input_nodes, *node.users):
                if other in nodes and other not in seen:
                    seen.add(other)
                    stack.append(other)
        parts.append([n for n in nodes if n in set(part)])
    return parts


def _tails_to_their_producers(proposed: list[Any]) -> list[Any]:
    """Move each connected part of a proposed region that reads only other
    regions (besides the graph's inputs) and that only the graph's output
    reads into the last of those regions; returns the regions left
    non-empty.

    FX's partitioner fuses the products of a training backward that make
    the weight gradients, independent of each other, into one region run
    after all the others (the small GPT of BENCHMARKS.md: 17 products and
    38 inputs, every activation gradient kept until the end). Each one joins
    the region that computes the gradient it reads, and runs while that
    gradient is fresh in the cache. Under activation checkpointing a product
    reads two regions, the one that recomputes its activation and the one
    that computes its gradient: it joins the later, the one none of the
    others depends on, where both were kept until the backward's end before
    (docs/torch/aot-autograd.md#checkpointed-regions-kept-activations-alive). No cycle can form: the
    part reads only regions and the graph's inputs, nothing but the output reads it, and
    the region it joins leads to none of the others it reads."""
    region_of = {node: part for part in proposed for node in part.nodes}
    order: dict[Any, int] = {}
    for part in proposed:
        pieces = _components(part.nodes)
        for piece in pieces:
            inside = set(piece)
            if any(u.op != "output" for n in piece for u in n.users if u not in inside):
                continue
            producers = {region_of.get(i) for n in piece for i in n.all_input_nodes
                         if i not in inside and i.op not in ("placeholder", "get_attr")}
            if not producers or None in producers or part in producers:
                continue
            target = _last_region(producers, order)
            if target is None:
                continue
            for node in piece:
                del part.nodes[node]
                target.nodes[node] = None
                region_of[node] = target
    return [part for part in proposed if part.nodes]


def _last_region(regions: set[Any], order: dict[Any, int]) -> Any:
    """The region of ``regions`` from which none of the others can be
    reached (the latest in graph order where several can be); None where
    there is none. ``order`` caches each node's position in its graph."""
    if len(regions) == 1:
        return next(iter(regions))
    if not order:
        graph = next(iter(next(iter(regions)).nodes)).graph
        order.update((node, i) for i, node in enumerate(graph.nodes))
    last = None
    for region in regions:
        others = {node for other in regions if other is not region for node in other.nodes}
        if _reaches(region.nodes, others) or (
                last is not None and max(order[n] for n in region.nodes)
                < max(order[n] for n in last.nodes)):
            continue
        last = region
    return last


def _reaches(nodes: Mapping[fx.Node, Any], targets: set[fx.Node]) -> bool:
    """Whether a path of users leads from ``nodes`` to one of ``targets``."""
    seen: set[fx.Node] = set()
    stack = [user for node in nodes for user in node.users if user not in nodes]
    while stack:
        node = stack.pop()
        if node in targets:
            return True
        if node not in seen:
            seen.add(node)
            stack.extend(node.users)
    return False


def partition(gm: fx.GraphModule, support: OpSupport, *, boxed: bool = False,
              recomputes: bool = False) -> Partitioned:
    """Fuse the LTC-lowerable parts of ``gm`` into submodules, in place.

    Ops that were never probed are probed first. ``boxed``: the graph is
    called boxed, freeing its inputs after their last use (a backward);
    with ``recomputes`` too (it recomputes checkpointed blocks) its regions
    are cut where their inputs die
    (docs/torch/aot-autograd.md#region-holds-inputs-until-it-returns). Elsewhere the cuts made 5-15
    times the regions for a measured peak 4-6% lower (GPT-2, Llama) or 1-4 MiB higher (timm's CNNs:
    docs/torch/aot-autograd.md#backward-cuts-pay-only-when-recomputing). (The plan key hashes this
    function's code: what it decides is what a plan stores.)
    """
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

    from .support import op_signature, strided_otherwise

    if buffer_writes_as_one(gm.graph):
        gm.recompile()  # the parent graph runs as it is where no region is made
    support.learn(gm.graph.nodes)
    _return_input_views_apart(gm.graph)
    eager = _strided_views(gm.graph, strided_otherwise)
    partitioner = CapabilityBasedPartitioner(gm, _Outside(support, eager) if eager else support,
                                             allows_single_node_partition=True)
    # A region must compute something to pay for its lookup and replay call:
    # one of views alone would only copy (LTC lowers views to copies).
    def computes(part: Any) -> bool:
        return any(op_signature(n) is not None and not n.target.is_view for n in part.nodes)

    proposed = [p for p in partitioner.propose_partitions() if computes(p)]
    proposed = _tails_to_their_producers(proposed)
    if boxed and recomputes:
        proposed = [p for p in split_where_inputs_die(proposed, _graph_order(gm))
                    if computes(p)]
    for part in proposed:
        _leave_out_trailing_views(part.nodes)
        _views_apart_at_edges(gm.graph, part.nodes)
    proposed = [p for p in proposed if p.nodes]
    # Graph order, so that region names are the same in every process.
    order = _graph_order(gm)
    proposed.sort(key=lambda p: min(order[n] for n in p.nodes))
    region_of = {node: f"{REGION_PREFIX}{i}" for i, p in enumerate(proposed) for node in p.nodes}
    region_ops = dict.fromkeys((f"{REGION_PREFIX}{i}" for i in range(len(proposed))), 0)
    total = 0
    eager: dict[str, int] = {}
    for node in gm.graph.nodes:
        if op_signature(node) is None:
            continue
        total += 1
        if node in region_of:
            region_ops[region_of[node]] += 1
        else:
            eager[str(node.target)] = eager.get(str(node.target), 0) + 1
    if proposed:
        # Each region's nodes, and so its outputs, in graph order: its FX
        # graph runs them in that order, and LTC's IR computes its outputs
        # one after the other (each with what it needs first). AOTAutograd
        # orders a checkpointed backward as autograd's engine would run it;
        # in the partitioner's own order a region made every weight gradient
        # after the whole chain of activation gradients, holding each
        # recomputed activation until then
        # (docs/torch/aot-autograd.md#checkpointed-regions-kept-activations-alive).
        fuse_by_partitions(gm, [dict.fromkeys(sorted(p.nodes, key=order.__getitem__))
                                for p in proposed],
                           prefix=REGION_PREFIX, always_return_tuple=True)
    return Partitioned(gm, tuple(region_ops), region_ops, total, eager)
