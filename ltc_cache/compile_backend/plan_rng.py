"""AOTAutograd's generator-state wrappers in a plan's graph, taken out of
what a whole-plan library compiles (docs/torch/aot-inductor.md#export-and-recomputing-backward).

An activation-checkpointed op that may draw random numbers is wrapped in
``run_and_save_rng_state`` in the forward and ``run_with_rng_state`` in
the backward (docs/torch/aot-autograd.md#checkpointing-adds-hop-and-rng-wrappers), and
``torch.export`` has no rule for either. Where the op draws nothing the library calls it directly.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..errors import Unrepeatable
from .graph_wire import rng_wrapper_name

if TYPE_CHECKING:
    from torch import fx

__all__ = ["RANDOM_RECOMPUTED", "rng_state_outputs", "unwrap_rng"]

# A recomputed op that draws random numbers (a checkpointed dropout): the
# library could not draw what the forward drew.
RANDOM_RECOMPUTED = "a recomputed op draws random numbers"


def rng_state_outputs(graph: fx.GraphModule) -> frozenset[int]:
    """The positions of ``graph``'s outputs that are the generator states
    ``run_and_save_rng_state`` saved for a recomputation
    (docs/torch/aot-autograd.md#checkpointing-adds-hop-and-rng-wrappers). A library leaves them out:
    its caller returns the generator's state at the call in their place, what the wrapper returns
    where the op it wraps draws nothing (:func:`unwrap_rng`)."""
    out = graph.graph.find_nodes(op="output")[0].args[0]
    return frozenset(i for i, node in enumerate(out if isinstance(out, list | tuple) else ())
                     if _state_of_rng_wrapper(node))


def _state_of_rng_wrapper(node: Any) -> bool:
    return getattr(node, "target", None) is operator.getitem and node.args[1] == 0 \
        and rng_wrapper_name(node.args[0].target) == "run_and_save_rng_state"


def unwrap_rng(graph: fx.GraphModule, inputs: list[torch.Tensor]) -> None:
    """Call the ops AOTAutograd wrapped in ``run_and_save_rng_state`` and
    ``run_with_rng_state`` directly, and return None for the states saved:
    ``torch.export`` has no rule for either wrapper. Sound only where the op
    draws nothing; an op with a ``dropout_p`` of 0, what a checkpointed
    attention block's ``scaled_dot_product_attention`` is in training, is
    the one kind known to. Raises Unrepeatable for any other. The states
    ``inputs`` hold for ``run_with_rng_state`` become the generator's:
    the per-region path the library is checked against sets them."""
    nodes = graph.graph
    placeholders = list(nodes.find_nodes(op="placeholder"))
    out_node = nodes.find_nodes(op="output")[0]
    for node in list(nodes.nodes):
        name = rng_wrapper_name(node.target) if node.op == "call_function" else None
        if name is None:
            continue
        op, *args = node.args if name == "run_and_save_rng_state" else node.args[1:]
        if not _draws_nothing(op, args, node.kwargs):
            raise Unrepeatable(f"{RANDOM_RECOMPUTED}: {op}")
        with nodes.inserting_before(node):
            call = nodes.call_function(op, tuple(args), dict(node.kwargs))
        if name == "run_with_rng_state":
            if node.args[0] in placeholders:
                inputs[placeholders.index(node.args[0])] = torch.get_rng_state()
            node.replace_all_uses_with(call)
        else:
            for use in list(node.users):
                if use.args[1] == 1:
                    use.replace_all_uses_with(call)
                else:
                    out_node.args = torch.fx.node.map_arg(
                        out_node.args, lambda n, state=use: None if n is state else n)
                nodes.erase_node(use)
        nodes.erase_node(node)
    graph.recompile()


def _draws_nothing(op: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """Whether ``op`` called on these arguments has a ``dropout_p`` of 0."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return False
    for position, argument in enumerate(schema.arguments):
        if argument.name == "dropout_p":
            value = kwargs.get("dropout_p", args[position] if position < len(args)
                               else argument.default_value)
            return value == 0
    return False
