"""What a fused library is compiled from: a graph of one call.

AOTInductor exports what it compiles (AOTAutograd's ``aot_export_module``:
functionalized, Inductor's decompositions applied) by running it on fake
tensors. A library is compiled from a graph whose one node calls the
stored TorchScript function (or a plan's per-region path), so that export
is the only trace: the interpreter dispatches every op, and the export
records exactly what the replay computes, views and all (:mod:`.aoti`).
(A small GPT's two plan parts, traced to aten graphs first and those
exported: 4.3 s of tracing; exported as one call: 1.9 s.)

:func:`aten_graph` still traces a function to an aten graph: for the
float64 run that arbitrates a failed check (:mod:`.exact`), and to be
compiled where this torch's export cannot call TorchScript
(:func:`.aoti.exports_call_scripts`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch

from ...fx_ops import aten_op_names
from .aoti import scripts_called_in_export

__all__ = ["CALL_FAILED", "as_tuple", "aten_graph", "one_call", "view_copies"]

# Set in a graph of one call's meta where the call raised (the export
# could not trace the function through it).
CALL_FAILED = "ltc_cache_call_failed"


def as_tuple(results: Any) -> tuple[Any, ...]:
    return results if isinstance(results, tuple) else (results,)


def _views_as_reshapes(traced: torch.fx.GraphModule) -> None:
    """Each ``view`` of ``traced`` made a ``reshape``, which is that view
    where the strides allow it and a copy where not. The export traces the
    graph again on fake tensors of its own, functionalized, whose strides
    can differ from the first trace's where a region's output was laid out
    otherwise: T5's training forward failed there ("Cannot view a tensor
    with shape [2, 2, 16, 8] and strides (256, 16, 1, 32) as (4, 16, 8)"),
    and fails so in a trace of one call (:func:`.build._compiled`).
    A library returns no view of its own making (aliases are taken from
    the reference's outputs, :func:`.build.output_aliases`), so what the view
    shared is nobody's business."""
    view, reshape = torch.ops.aten.view.default, torch.ops.aten.reshape.default
    for node in traced.graph.nodes:
        if node.op == "call_function" and node.target is view:
            node.target = reshape
    traced.recompile()


def view_copies() -> dict[Any, Any]:
    """``x_copy`` ops (LTC's views, docs/torch/ltc.md#views-are-lowered-to-copies) as the view
    ``x`` and a contiguous copy: Inductor lowers the views, while several
    ``x_copy`` ops (``slice_copy``, ``select_copy``) have neither a
    lowering nor a C shim, and a library that falls back to Python's proxy
    executor cannot run in the C++ runner
    (docs/torch/aot-inductor.md#view-copies-lack-aoti-kernels)."""
    aten = torch.ops.aten
    table: dict[Any, Any] = {}
    # Every registered op: dir(torch.ops.aten) lists only those resolved so far.
    names = {n.removeprefix("aten::").partition(".")[0]
             for n in aten_op_names() if n.startswith("aten::")}
    for name in sorted(names):
        base = name.removesuffix("_copy")
        if name == base or name.startswith("_") or base not in names:
            continue
        copy_op, view_op = getattr(aten, name), getattr(aten, base)
        for overload in copy_op.overloads():
            if overload in view_op.overloads() and not overload.endswith("out"):
                view = getattr(view_op, overload)
                table[getattr(copy_op, overload)] = (
                    lambda *a, _view=view, **k: _view(*a, **k).clone(
                        memory_format=torch.contiguous_format))
    # LTC's view_copy also takes inputs no view can read (a permuted
    # tensor, flattened): what it computes is reshape's.
    table[aten.view_copy.default] = lambda x, size: aten.reshape.default(x, size).clone(
        memory_format=torch.contiguous_format)
    return table


def aten_graph(script: Callable[..., Any], inputs: list[torch.Tensor]) -> torch.fx.GraphModule:
    """The aten graph ``script`` runs on inputs laid out as ``inputs``,
    run unoptimized, as a replay runs it: TorchScript's optimizing
    executor folds a graph's constant parts (a mask made from ``arange``)
    into tensors and pools equal ones, comparing them with ``aten.equal``,
    which fake tensors cannot answer
    (docs/torch/aot-inductor.md#constant-masks-need-an-unoptimized-trace)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    with torch.no_grad(), torch.jit.optimized_execution(False):
        traced = make_fx(lambda *a: as_tuple(script(*a)), decomposition_table=view_copies(),
                         tracing_mode="fake")(*inputs)
    _views_as_reshapes(traced)
    return traced


def one_call(fn: Callable[..., Any], inputs: int, outputs: int) -> torch.fx.GraphModule:
    """A graph of ``inputs`` tensors whose one node calls ``fn`` (a
    TorchScript function, a plan's per-region path) on them, run
    unoptimized as a replay runs it, and returns its ``outputs`` tensors:
    what AOTInductor exports, with :func:`view_copies` among its
    decompositions (:func:`.aoti.compile_library`), and compiles. Where
    the call raises, the graph's meta says so (:data:`CALL_FAILED`)."""
    def call(*args: torch.Tensor) -> tuple[Any, ...]:
        try:
            with torch.jit.optimized_execution(False), scripts_called_in_export():
                return as_tuple(fn(*args))
        except Exception:
            module.meta[CALL_FAILED] = True
            raise

    graph = torch.fx.Graph()
    called = graph.call_function(call, tuple(graph.placeholder(f"input_{i}")
                                             for i in range(inputs)))
    graph.output(tuple(graph.call_function(operator.getitem, (called, i))
                       for i in range(outputs)))
    module = torch.fx.GraphModule(torch.nn.Module(), graph)
    return module
