"""The private pieces of FX and of the ATen operators its graphs call, as
ltc_cache uses them: the operator classes a node's target is checked
against (``torch._ops``), torch's pytree (``torch.utils._pytree``), the
dispatcher's list of registered ops and its switch for the Python
dispatcher (``torch._C``), decomposition tables (``torch._decomp``), the
random-op wrappers of checkpointed blocks (``torch._prims.rng_prims``),
FX's boxed code generator and lazily generated graph module
(``torch.fx.graph._BoxedCodeGen``, ``torch.fx._lazy_graph_module``), and
a module run with other tensors in place of its own
(``torch.nn.utils.stateless._reparametrize_module``).

None of it is public torch API. This module is the one place in the
package that touches these names (``tests/common/test_layers.py`` holds
every other module to that), so that a torch upgrade that moves them
breaks here, and ``tests/common/test_torch_private.py`` (its section "FX
and ATen operators") is where it breaks first, by name. It sits at the
ground of the layers: ``graph/``, ``compile_backend/`` and ``program/`` all
read graphs of ATen ops.

Written against torch 2.13. The decomposition tables and the random-op
wrappers are imported by the functions that need them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import fx
from torch._ops import HigherOrderOperator, OpOverload, OpOverloadPacket
from torch.utils._pytree import tree_leaves, tree_map

__all__ = ["HigherOrderOperator", "OpOverload", "OpOverloadPacket", "aten_op_names",
           "boxed_code_generator", "decompositions_of", "lazy_module_class",
           "python_dispatcher_disabled", "reparametrized", "rng_wrapper", "tree_leaves",
           "tree_map"]


def aten_op_names() -> list[str]:
    """Every op registered with the dispatcher (``"aten::add.Tensor"``),
    resolved or not: ``dir(torch.ops.aten)`` lists only those resolved so
    far."""
    return list(torch._C._dispatch_get_all_op_names())


def python_dispatcher_disabled() -> contextlib.AbstractContextManager[Any]:
    """Outside the Python dispatcher (its kernels for some ops are not the
    C++ ones, docs/torch/ltc.md#cnn-backward-lowers-more-than-probed)."""
    return torch._C._DisablePythonDispatcher()


def decompositions_of(ops: Iterable[Any]) -> dict[Any, Callable[..., Any]]:
    """torch's decompositions of ``ops`` (those it has)."""
    from torch._decomp import get_decompositions

    return get_decompositions(list(ops))


def rng_wrapper(name: str) -> Any:
    """The random-op wrapper of a checkpointed block named ``name``
    (``run_and_save_rng_state``, ``run_with_rng_state``), or None where
    this torch has none of that name."""
    from torch._prims import rng_prims

    return getattr(rng_prims, name, None)


def boxed_code_generator() -> Any | None:
    """FX's code generator for AOTAutograd's boxed convention (the graph
    takes one list of inputs and empties it), or None where this torch.fx
    lacks it (docs/torch/aot-autograd.md#boxed-backward-frees-inputs)."""
    try:
        from torch.fx.graph import _BoxedCodeGen
    except ImportError:
        return None
    return _BoxedCodeGen()


def lazy_module_class() -> type[fx.GraphModule]:
    """torch's GraphModule that generates its code on first use, where this
    torch has it, else GraphModule."""
    try:
        from torch.fx._lazy_graph_module import _LazyGraphModule
    except ImportError:
        return fx.GraphModule
    return _LazyGraphModule if issubclass(_LazyGraphModule, fx.GraphModule) else fx.GraphModule


def reparametrized(module: torch.nn.Module, tensors: Mapping[str, torch.Tensor]
                   ) -> contextlib.AbstractContextManager[Any]:
    """``module`` with ``tensors`` (by parameter and buffer name) in place
    of its own, tied weights kept tied: ``torch.func.functional_call``'s
    reparametrisation, for a caller that calls ``forward`` itself."""
    from torch.nn.utils.stateless import _reparametrize_module

    return _reparametrize_module(module, dict(tensors), tie_weights=True)
