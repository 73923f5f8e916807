"""What an FX node holds, read one way everywhere: its value (the fake or
meta tensor, or scalar, that tracing recorded) and whether that value is
symbolic (Dynamo's dynamic shapes)."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

__all__ = ["is_symbolic", "node_value"]

_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def node_value(arg: Any) -> Any:
    """The recorded value of ``arg`` when it is a node (AOTAutograd's
    ``val``, else Dynamo's ``example_value``); ``arg`` itself otherwise."""
    if isinstance(arg, fx.Node):
        return arg.meta.get("val", arg.meta.get("example_value"))
    return arg


def is_symbolic(value: Any) -> bool:
    """Whether ``value`` is a symbolic scalar or a tensor of symbolic shape
    or stride."""
    if isinstance(value, _SYMBOLIC):
        return True
    if not isinstance(value, torch.Tensor):
        return False
    # Only a strided tensor has strides (a sparse one raises on stride()).
    strides = value.stride() if value.layout == torch.strided else ()
    return any(isinstance(d, torch.SymInt) for d in (*value.shape, *strides))
