"""Regions of a backward cut where their inputs die.

A region is one call: every input is held by its caller until it returns,
however early the region is done with it. Cut in two where that frees most
of its inputs, a region's peak memory falls
(docs/torch/aot-autograd.md#region-holds-inputs-until-it-returns). The plan key hashes this module's
code (:func:`.plan.plan_key`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from .nodes import is_symbolic, node_value

__all__ = ["split_where_inputs_die"]


# A region is split where that lowers its peak (its inputs, which its
# caller holds until it returns, and its values) by this much
# (docs/torch/aot-autograd.md#region-holds-inputs-until-it-returns).
_MIN_SPLIT_BYTES = 1 << 20


def _bytes(node: Any) -> int:
    """The bytes ``node``'s value holds of its own (a view: none), 0 where
    unknown or symbolic."""
    if not isinstance(node, fx.Node) or node.op == "get_attr" or (
            node.op == "call_function" and getattr(node.target, "is_view", False)):
        return 0
    value = node_value(node)
    values = value if isinstance(value, (tuple, list)) else (value,)
    total = 0
    for v in values:
        if isinstance(v, torch.Tensor) and not is_symbolic(v):
            total += v.numel() * v.element_size()
    return total


def _several(node: fx.Node) -> bool:
    """Whether ``node`` makes several values (a tuple its getitems read)."""
    return isinstance(node_value(node), (tuple, list))


def split_where_inputs_die(proposed: list[Any], order: dict[fx.Node, int]) -> list[Any]:
    """Cut each proposed region in two where that frees most of its inputs,
    recursively; returns the regions, in no particular order.

    A region is one call: every input is held by its caller (the parent
    graph's locals, the call's arguments) until it returns, however early
    the region is done with it. A checkpointed backward's region ran one
    layer's gradient down to its input and then the previous layer's
    recomputation and gradient: the first layer's attention gradients,
    activations and residual gradient stayed alive through the second's
    MLP, its peak (docs/torch/aot-autograd.md#region-holds-inputs-until-it-returns). A prefix of a
    region in graph order is a region, and so is the rest: a path from one of its
    nodes to another through nodes outside it would make it no region, and
    no path leads from a later node to an earlier one. The graph is a
    backward, called boxed (:mod:`.boxed`): its own inputs are freed after
    their last use too."""
    from torch.fx.passes.infra.partitioner import Partition

    done: list[Any] = []
    todo = list(proposed)
    while todo:
        part = todo.pop()
        nodes = sorted(part.nodes, key=order.__getitem__)
        cut = _best_cut(nodes, order)
        if cut is None:
            done.append(part)
            continue
        todo.append(Partition(nodes=nodes[:cut]))
        todo.append(Partition(nodes=nodes[cut:]))
    return done


def _best_cut(nodes: list[fx.Node], order: dict[fx.Node, int]) -> int | None:
    """The index where ``nodes`` (a region, in graph order) is best cut: the
    one that lowers the region's peak most (run in graph order, each value
    freed after its last reader, the region's inputs held to its end), or
    None where none lowers it by ``_MIN_SPLIT_BYTES`` or more."""
    n = len(nodes)
    if n < 2:
        return None
    position = {node: i for i, node in enumerate(nodes)}
    start = order[nodes[0]]
    # Each input the region alone reads last: freed by a cut after its last reader.
    frees_at = [0] * n
    seen: set[fx.Node] = set()
    for node in nodes:
        for source in node.all_input_nodes:
            if source in position or source in seen:
                continue
            seen.add(source)
            size = _bytes(source)
            if not size or any(u not in position and order[u] > start for u in source.users):
                continue
            frees_at[max(position[u] for u in source.users if u in position)] += size
    if not any(frees_at):
        return None
    # Each value's life in the region: to its last reader (a view's readers
    # are its base's), to the end for an output of the region.
    is_view = [getattr(node.target, "is_view", False) for node in nodes]
    size = [_bytes(node) for node in nodes]
    end = list(range(n))
    for i in range(n - 1, -1, -1):
        node = nodes[i]
        for user in node.users:
            if user not in position:
                end[i] = n
            else:
                j = position[user]
                end[i] = max(end[i], end[j] if is_view[j] else j)
    live = [0] * (n + 1)
    for i in range(n):
        live[i] += size[i]
        live[min(end[i], n - 1) + 1] -= size[i]
    for i in range(1, n):
        live[i] += live[i - 1]
    live = live[:n]
    peak = max(live)
    before = [0] * n  # max of live over the positions before each index
    for i in range(1, n):
        before[i] = max(before[i - 1], live[i - 1])
    # A cut leaves computing ops on both sides and hands the second part no
    # view (a region returns a view as a copy laid out otherwise than traced)
    # and no tuple: an op of several outputs (convolution_backward,
    # native_batch_norm_backward) stays with the getitems that take them
    # apart, since a region returns tensors only (LTC refuses a region that
    # returns a tuple, and the region runs eagerly:
    # docs/torch/aot-autograd.md#backward-cuts-pay-only-when-recomputing).
    computing = [node.op == "call_function" and not is_view[i] for i, node in enumerate(nodes)]
    first_computing = computing.index(True) if any(computing) else n
    last_computing = n - 1 - computing[::-1].index(True) if any(computing) else -1
    whole_only = [is_view[i] or _several(node) for i, node in enumerate(nodes)]
    whole_read_until = 0  # the latest reader of a view or a tuple before the cut
    best, best_gain, freed = None, 0, 0
    for c in range(1, n):
        freed += frees_at[c - 1]
        if whole_only[c - 1]:
            whole_read_until = max(whole_read_until, max(
                (position[u] for u in nodes[c - 1].users if u in position), default=0))
        if not frees_at[c - 1] or whole_read_until >= c \
                or not first_computing < c <= last_computing:
            continue
        # After the cut, a value of the first part the second reads is held
        # to the second's end: what it adds once its last reader ran.
        held_after = [0] * (n + 1)
        for i in range(c):
            if c <= end[i] < n - 1 and size[i]:
                held_after[end[i] + 1] += size[i]
        second, held = 0, 0
        for p in range(c, n):
            held += held_after[p]
            second = max(second, live[p] + held)
        gain = peak - max(before[c], second - freed)
        if gain > best_gain:
            best, best_gain = c, gain
    if best is None or best_gain < _MIN_SPLIT_BYTES:
        return None
    return best
