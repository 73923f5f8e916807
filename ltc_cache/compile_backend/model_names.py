"""The name of a compiled graph's entries: the class of the module that
``torch.compile`` wrapped, found on the stack, else the frame's."""

from __future__ import annotations

import logging
import re
import sys
from typing import TYPE_CHECKING

import torch
from torch import fx

if TYPE_CHECKING:
    pass

logger = logging.getLogger("ltc_cache.dynamo")


def model_name(gm: fx.GraphModule) -> str:
    """The class of the compiled module (else the function), for entry
    names. Not the class of the frame Dynamo compiles: a graph break inside
    a submodule (a hook on ``fc1`` that prints) makes Dynamo compile
    ``Linear.forward`` and then a resume function of the model's forward,
    and both graphs belong to the model."""
    compiled = _compiled_module()
    if compiled is not None:
        return type(compiled).__name__
    code = None
    try:  # the frame Dynamo is compiling; internal API, so only a hint
        from ..dynamo_package import compiling_frame

        frame = compiling_frame()
        for local in ("self", "fn"):
            if isinstance(frame.f_locals.get(local), torch.nn.Module):
                return type(frame.f_locals[local]).__name__
        code = frame.f_code.co_qualname
    except Exception:  # no frame, or the API moved: fall back to the graph
        pass
    for node in gm.graph.nodes:
        for path, cls in (node.meta.get("nn_module_stack") or {}).values():
            # L['self'], G['model']; not L['self'].fc1, nor a resume
            # function's L['___stack0'] (a submodule held on the stack).
            if _ROOT_MODULE.fullmatch(str(path)):
                return getattr(cls, "__name__", str(cls))
    # ``Net.forward``, ``Net.torch_dynamo_resume_in_forward_at_12``, ``step``
    return code.split(".")[0] if code and not code.startswith("<") else "fn"


_ROOT_MODULE = re.compile(r"[LG]\['(?!___)[^']*'\]|self")


def _compiled_module() -> torch.nn.Module | None:
    """The module ``torch.compile`` (or ``Module.compile``) wrapped, found
    on the Python stack that called into Dynamo; None for a compiled
    function that no compiled module calls."""
    try:
        from ..dynamo_package import OptimizedModule
    except ImportError:
        return None
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self") if "self" in frame.f_code.co_varnames else None
        if isinstance(owner, OptimizedModule):
            return owner._orig_mod
        if isinstance(owner, torch.nn.Module) \
                and getattr(owner, "_compiled_call_impl", None) is not None:
            return owner
        frame = frame.f_back
    return None
