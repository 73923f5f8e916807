"""A program's training graph cut where DistributedDataParallel's gradient
buckets end, so that a bucket's all-reduce starts while the backward of the
rest still runs.

A compiled training graph is one autograd node: its backward hands DDP's
reducer every gradient at its end, so the all-reduces run after the
backward, where eager DDP starts each bucket's as soon as its gradients are
in. Dynamo's DDPOptimizer cuts the graphs it captures under DDP for this
reason; a program is captured outside DDP's forward
(docs/torch/distributed.md#ddp-forward-has-nothing-to-compile), so its graph is cut here instead,
when it is first called inside one. The rule is the reducer's own: walking the graph from its end
(the backward's start), a piece closes once the parameters it uses fill a bucket, ``bucket_cap_mb``
(DDP's first bucket is 1 MiB where the cap is left at its default). Each piece is compiled on its
first call as a program's graph is, its plan a cache entry of its own. The cut depends only
on the graph, the parameters' sizes and DDP's caps, so a warm rank cuts
where the cold one did and finds each piece's plan stored.

``torch._dynamo.config.optimize_ddp = False`` turns the cut off, as it
does DDPOptimizer's.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from ..dynamo_package import ddp_optimizer_on
from ..errors import first_line

__all__ = ["cut_at_buckets", "running_data_parallel"]

logger = logging.getLogger("ltc_cache.precompile")


def running_data_parallel() -> Any:
    """The DDP whose forward is running (DDP sets it around its module's
    call, for DDPOptimizer), or None."""
    ddp = getattr(torch.nn.parallel, "DistributedDataParallel", None)
    if ddp is None or not ddp_optimizer_on():
        return None
    return ddp._get_active_ddp_module()


def cut_at_buckets(ddp: Any, gm: fx.GraphModule, args: Sequence[Any], name: str,
                   piece: Callable[[fx.GraphModule, str], Callable[..., Any]]
                   ) -> fx.GraphModule | None:
    """``gm``, called on ``args`` inside the forward of ``ddp``, cut into
    pieces at its gradient buckets, each piece the callable
    ``piece(graph, name)`` makes; None where nothing needs a gradient or
    one bucket holds every parameter."""
    if not torch.is_grad_enabled():
        return None
    try:
        return _cut(ddp, gm, args, name, piece)
    except Exception as exc:  # the graph is compiled whole, as before the cut
        logger.warning("%s: not cut at DDP's buckets (%s: %s)", name, type(exc).__name__,
                       first_line(exc))
        return None


def _cut(ddp: Any, gm: fx.GraphModule, args: Sequence[Any], name: str,
         piece: Callable[[fx.GraphModule, str], Callable[..., Any]]) -> fx.GraphModule | None:
    params = {node: arg for node, arg in zip(gm.graph.find_nodes(op="placeholder"), args,
                                             strict=True)
              if isinstance(arg, torch.nn.Parameter) and arg.requires_grad
              and not getattr(arg, "_ddp_ignored", False)}
    if not params:
        return None
    config = getattr(ddp, "_bucket_config", None)
    first = getattr(config, "first_bucket_bytes_cap", ddp.bucket_bytes_cap)
    piece_of = _pieces(gm, params, first, ddp.bucket_bytes_cap)
    count = max(piece_of.values(), default=0) + 1
    if count == 1:
        return None
    cut = _split(gm, piece_of, count, name, piece)
    logger.info("%s: cut into %d pieces at DDP's gradient buckets", name, count)
    return cut


def _split(gm: fx.GraphModule, piece_of: dict[fx.Node, int], count: int, name: str,
           piece: Callable[[fx.GraphModule, str], Callable[..., Any]]) -> fx.GraphModule:
    from torch.fx.passes.split_module import split_module

    cut = split_module(gm, None, piece_of.__getitem__, tuple_return=True)
    # What AOTAutograd reads of a Dynamo graph, which split_module drops.
    sources = {n.name: getattr(n, "_dynamo_source", None)
               for n in gm.graph.find_nodes(op="placeholder")}
    for index in range(count):
        sub = getattr(cut, f"submod_{index}")
        for node in sub.graph.find_nodes(op="placeholder"):
            node._dynamo_source = sources.get(node.name)
        sub.meta = gm.meta
        sub._param_name_to_source = getattr(gm, "_param_name_to_source", None)
        setattr(cut, f"submod_{index}", _Piece(piece(sub, f"{name}.bucket{index}")))
    return cut


def _pieces(gm: fx.GraphModule, params: dict[fx.Node, torch.Tensor], first_cap: int,
            cap: int) -> dict[fx.Node, int]:
    """Each node's piece, numbered in the graph's order."""
    # A parameter's gradient is whole once the backward reaches its first
    # use (a tied embedding: the model's first op, not its head), so it
    # counts there, as it falls into the reducer's buckets.
    position = {node: index for index, node in enumerate(gm.graph.nodes)}.__getitem__
    counted_at: dict[fx.Node, list[fx.Node]] = {}
    for param in params:
        first_use = min(param.users, key=position, default=None)
        if first_use is not None:
            counted_at.setdefault(first_use, []).append(param)
    buckets: list[list[fx.Node]] = [[]]  # from the graph's end
    size = 0
    for node in reversed(gm.graph.nodes):
        if node.op in ("placeholder", "output"):
            continue
        if size >= (first_cap if len(buckets) == 1 else cap) and _feeds_others(buckets[-1]):
            buckets.append([])
            size = 0
        size += sum(params[param].untyped_storage().nbytes()
                    for param in counted_at.get(node, ()))
        buckets[-1].append(node)
    if len(buckets) > 1 and size == 0:  # a preamble without parameters joins the next
        preamble = buckets.pop()
        buckets[-1].extend(preamble)
    last = len(buckets) - 1
    piece_of = {node: last - index for index, bucket in enumerate(buckets) for node in bucket}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "call_function" and node.target is operator.getitem:
            # An element goes with what it is taken from: a piece passes
            # tensors on, not the tuples they are parts of.
            piece_of[node] = piece_of.get(node.args[0], piece_of.get(node, 0))
    return {node: piece_of.get(node, 0) for node in gm.graph.nodes}


def _feeds_others(bucket: list[fx.Node]) -> bool:
    """Whether a value made in ``bucket`` is used outside it (a bucket that
    fed nothing further would be a piece with no output)."""
    inside = set(bucket)
    return any(user not in inside for node in bucket for user in node.users)


class _Piece(torch.nn.Module):
    """A piece of the cut graph, compiled on its first call."""

    def __init__(self, compiled: Callable[..., Any]) -> None:
        super().__init__()
        self.compiled = compiled

    def forward(self, *args: Any) -> Any:
        return self.compiled(*args)
