"""What nothing reads, nodes and graph inputs, removed
(:func:`drop_dead_code`)."""

from __future__ import annotations

import torch

from ..layout import Source


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
