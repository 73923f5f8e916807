"""Rebuild a callable from an entry: parse the stored IR, bind module
tensors live, and keep the per-call path to building one input list and one
call.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .entry import Entry
from .keys import module_tensors
from .layout import Source

__all__ = ["CompiledGraph", "GraphFunction", "build_function", "count_nodes"]

# A TorchScript function made from a graph: ``fn(*inputs) -> outputs``.
GraphFunction = Callable[..., Any]

_names = itertools.count()


def build_function(ir: str) -> tuple[GraphFunction, int]:
    """Parse stored IR into a callable TorchScript function (and its number of
    outputs). Raises RuntimeError where the IR does not parse."""
    graph = torch._C.parse_ir(ir)
    num_outputs = len(list(graph.outputs()))
    graph.makeMultiOutputIntoTuple()
    function = torch._C._create_function_from_graph(f"ltc_cache_graph_{next(_names)}", graph)
    return function, num_outputs


def count_nodes(ir: str) -> int:
    return sum(1 for _ in torch._C.parse_ir(ir).nodes()) if ir else 0


class CompiledGraph:
    """The replay callable: ``compiled(*args) -> list`` of the model's outputs.

    Like the original, it trusts its caller (TorchDynamo's guards) to call it
    only with arguments laid out as at trace time.
    """

    __slots__ = (
        "__weakref__",
        "_arg_slots",
        "_fn",
        "_inputs",
        "_outputs",
        "_single",
        "_updates",
        "entry",
    )

    def __init__(self, entry: Entry, function: GraphFunction | None, num_outputs: int,
                 model: torch.nn.Module) -> None:
        self.entry = entry
        self._fn = function
        self._single = num_outputs == 1
        live = module_tensors(model) if _needs_module(entry) else {}
        missing = sorted({s.ref for s in _sources(entry) if s.kind == "attr"} - live.keys())
        if missing:
            raise KeyError(f"the model has no tensor at {', '.join(missing)}")

        def bound(s: Source) -> Any:
            return live[s.ref] if s.kind == "attr" else s.ref

        # Module tensors are resolved once: ``load_state_dict`` copies into the
        # same objects, so they stay current (binding by path every call costs
        # more than the whole replay gains over eager).
        self._inputs = [None if s.kind == "arg" else bound(s) for s in entry.inputs]
        self._arg_slots = [(i, s.ref) for i, s in enumerate(entry.inputs) if s.kind == "arg"]
        self._outputs = [(s.kind, bound(s)) for s in entry.outputs]
        self._updates = [(u.output, u.target.kind, bound(u.target)) for u in entry.updates]

    def __call__(self, *args: Any) -> list[Any]:
        if self._fn is None:
            results: Sequence[Any] = ()
        else:
            inputs = self._inputs.copy()
            for slot, index in self._arg_slots:
                inputs[slot] = args[index]
            # The profiling executor spends ~100 ms optimising on each of the
            # first calls; plain interpretation of this straight-line graph is
            # as fast once warm (see BENCHMARKS.md).
            with torch.jit.optimized_execution(False):
                results = self._fn(*inputs)
            if self._single:
                results = (results,)
        for output, kind, target in self._updates:
            if kind == "arg":
                args[target].copy_(results[output])
            else:
                with torch.no_grad():
                    target.copy_(results[output])
        return [_pick(kind, ref, args, results) for kind, ref in self._outputs]


def _pick(kind: str, ref: Any, args: Sequence[Any], results: Sequence[Any]) -> Any:
    if kind == "out":
        return results[ref]
    if kind == "arg":
        return args[ref]
    return ref  # attr / const / value / none: bound at build time


def _sources(entry: Entry) -> list[Source]:
    return [*entry.inputs, *entry.outputs, *(u.target for u in entry.updates)]


def _needs_module(entry: Entry) -> bool:
    return any(s.kind == "attr" for s in _sources(entry))
