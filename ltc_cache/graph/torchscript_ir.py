"""Every use ltc_cache makes of TorchScript's IR API, which is torch-private
(``torch._C``): a stored graph is LTC's TorchScript IR as text, parsed back
(:func:`parse_ir`), rewritten node by node (``graph/rewrites/``) and made a
function (:func:`function_from_graph`) that a replay calls with the graph
executor's optimisation off. The stored format depends on all of it.

This module is the one place in the package that names these
(``tests/common/test_layers.py`` holds every other module to that), so a
torch upgrade that moves one breaks here, and
``tests/common/test_torch_private.py`` (its TorchScript IR section) is
where it breaks first, by name. Written against torch 2.13.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._C import BoolType, Graph, ListType, Node, TensorType, Value
from torch._C import Type as JitType

__all__ = ["BoolType", "Graph", "JitType", "ListType", "Node", "TensorType", "Value",
           "executor_optimize", "function_from_graph", "parse_ir", "parse_schema",
           "remove_dead_code", "set_executor_optimize"]


def parse_ir(text: str, *, tensor_constants: bool = False) -> Graph:
    """The graph ``text`` (``graph(%p0 : Tensor, ...)``) holds; with
    ``tensor_constants``, tensor constants written in it are read too
    (refused otherwise). Raises RuntimeError where it does not parse."""
    return torch._C.parse_ir(text, parse_tensor_constants=tensor_constants)


def function_from_graph(name: str, graph: Graph) -> Any:
    """A TorchScript function running ``graph``, called with its inputs."""
    return torch._C._create_function_from_graph(name, graph)


def parse_schema(text: str) -> Any:
    """An op's schema from its text (``aten::add.Tensor(Tensor self, ...) -> Tensor``)."""
    return torch._C.parse_schema(text)


def remove_dead_code(graph: Graph) -> None:
    """Remove the nodes whose results nothing reads, and merge equal constants."""
    torch._C._jit_pass_dce(graph)
    torch._C._jit_pass_constant_pooling(graph)


def executor_optimize() -> bool:
    """Whether TorchScript's graph executor optimises (profiles, fuses) the
    functions it runs."""
    return bool(torch._C._get_graph_executor_optimize())


def set_executor_optimize(on: bool) -> None:
    """Turn the graph executor's optimisation on or off, for the whole process."""
    torch._C._set_graph_executor_optimize(on)
