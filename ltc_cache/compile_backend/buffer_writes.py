"""The writes that end a graph into its inputs, made one call.

A region writes none of its inputs, so such writes (BatchNorm's running
statistics) run eagerly in the parent graph after the regions; one
``_foreach_copy_`` makes them all. The plan key hashes this module's code
(:func:`.plan.plan_key`).
"""

from __future__ import annotations

import torch
from torch import fx

__all__ = ["buffer_writes_as_one"]

_aten = torch.ops.aten


def buffer_writes_as_one(graph: fx.Graph) -> bool:
    """Make the ``copy_`` ops that end the graph, each writing one of its
    inputs (BatchNorm's running statistics, three a layer:
    docs/torch/aot-autograd.md#buffer-updates-stay-in-training-graph), one ``_foreach_copy_``, in
    place.

    A region writes none of its inputs, so the writes run eagerly after the
    regions whatever is done; one call makes them all, where each ``copy_``
    is a Python call of the parent graph (51 a step for GhostNet:
    docs/torch/aot-autograd.md#running-statistics-written-in-one-call). Only the run of them just
    before the output: nothing reads an input after it is written there, so writing them together
    changes nothing."""
    output = next(node for node in reversed(graph.nodes) if node.op == "output")
    writes: list[fx.Node] = []
    node = output.prev
    while node.op == "call_function" and node.target is _aten.copy_.default \
            and not node.users and len(node.args) == 2 and not node.kwargs \
            and isinstance(node.args[0], fx.Node) and node.args[0].op == "placeholder":
        writes.append(node)
        node = node.prev
    destinations = [write.args[0] for write in writes]
    if len(writes) < 2 or len(set(destinations)) < len(destinations):
        return False
    writes.reverse()
    with graph.inserting_before(output):
        batched = graph.call_function(_aten._foreach_copy_.default,
                                      ([w.args[0] for w in writes], [w.args[1] for w in writes]))
    batched.meta["val"] = None
    for write in writes:
        graph.erase_node(write)
    return True
