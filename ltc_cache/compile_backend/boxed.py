"""A graph called on a list it empties, so each input is freed after its
last use.

A backward graph's inputs are the tensors its forward saved: the
activations, or with gradient checkpointing the inputs of each recomputed
block. Called as ``graph(*inputs)``, every one of them is held by the call
until the graph returns, however early the graph is done with it. FX can
generate a graph's code in AOTAutograd's boxed convention instead: the
function takes the list, moves its items into locals, empties it, and
drops each local after its last use, as the graph's code always does
(docs/torch/aot-autograd.md#boxed-backward-frees-inputs). That code generator, ``_BoxedCodeGen``, is
private to torch.fx: :mod:`ltc_cache.fx_ops` fences it, and
``tests/compile_backend/test_boxed.py`` pins it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import fx

from ..fx_ops import boxed_code_generator

__all__ = ["boxed"]


def boxed(graph: Callable[..., Any]) -> Callable[[list[Any]], Any]:
    """``graph`` called on a list of its inputs, which the call empties.
    A graph module's inputs are freed one by one as it runs; anything else
    (and a graph module should torch.fx lack the code generator) is called
    on the list's items, which the call holds to its end."""
    if isinstance(graph, fx.GraphModule):
        codegen = boxed_code_generator()
        if codegen is not None:
            copy = fx.Graph()
            copy.output(copy.graph_copy(graph.graph, {}))
            copy.set_codegen(codegen)
            # The same submodules and constants as ``graph``: its regions
            # are extracted once, whichever of the two calls them.
            boxed_graph = fx.GraphModule(graph, copy)
            # A plan's graph run by its whole-graph library where it has one
            # (ltc_cache/compile_backend/plan_library.py): the library decides.
            plan = vars(graph).get("forward")
            return plan.boxed(boxed_graph) if hasattr(plan, "boxed") else boxed_graph

    return lambda inputs: graph(*inputs)
