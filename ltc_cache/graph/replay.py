"""Rebuild a callable from an entry: parse the stored IR, bind module
tensors live, and keep the per-call path to building one input list and one
call.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..entries.entry import Entry, check_layout
from ..entries.layout import Source
from ..errors import EntryError, WrongType
from .graph_keys import module_tensors
from .torchscript_ir import executor_optimize, function_from_graph, parse_ir, set_executor_optimize

__all__ = ["CompiledGraph", "GraphFunction", "build_function", "check_usable", "count_nodes"]

# A TorchScript function made from a graph: ``fn(*inputs) -> outputs``.
GraphFunction = Callable[..., Any]

_names = itertools.count()


def build_function(ir: str) -> GraphFunction | None:
    """Parse stored IR into a TorchScript function that returns a tuple of
    the graph's outputs (None for an empty IR). Raises RuntimeError where the
    IR does not parse."""
    if not ir:
        return None
    graph = parse_ir(ir)
    graph.makeMultiOutputIntoTuple()
    return function_from_graph(f"ltc_cache_graph_{next(_names)}", graph)


def count_nodes(ir: str) -> int:
    return sum(1 for _ in parse_ir(ir).nodes()) if ir else 0


def check_usable(entry: Entry, function: GraphFunction | None,
                 tensors: Mapping[str, torch.Tensor], num_args: int) -> None:
    """Raise EntryError unless ``entry`` (parsed into ``function``) can
    replay a model holding ``tensors`` on ``num_args`` arguments. The key
    already covers the torch version and the model's tensors; this holds
    for an entry that got under the key anyway (written wrong, or planted),
    whose replay would otherwise fail inside the user's model, or run what
    another torch traced."""
    written_by = entry.meta.get("torch_version")
    if written_by != torch.__version__:
        raise EntryError(f"written by torch {written_by}, this is torch {torch.__version__}",
                         entry.key)
    if function is None:
        graph_inputs = graph_outputs = 0
    else:
        graph_inputs = len(function.schema.arguments)
        results = function.schema.returns[0].type  # a tuple (makeMultiOutputIntoTuple)
        graph_outputs = len(results.elements()) if hasattr(results, "elements") else 1
    try:
        check_layout(entry, graph_inputs=graph_inputs, graph_outputs=graph_outputs,
                     num_args=num_args)
    except EntryError as exc:
        raise EntryError(str(exc), entry.key) from None
    _check_tensors(entry, tensors)


def _check_tensors(entry: Entry, tensors: Mapping[str, torch.Tensor]) -> None:
    missing = entry.attr_paths - tensors.keys()
    if missing:
        raise EntryError(f"names tensors the model lacks: {', '.join(sorted(missing))}",
                         entry.key)


class CompiledGraph:
    """The replay callable: ``compiled(*args) -> list`` of the model's outputs.

    Like the original, it trusts its caller (TorchDynamo's guards) to call it
    only with arguments laid out as at trace time.
    """

    __slots__ = (
        "__weakref__",
        "_all_results",
        "_bound",
        "_fn",
        "_from_args",
        "_from_results",
        "_gather",
        "_positions",
        "_template",
        "_updates",
        "entry",
    )

    def __init__(self, entry: Entry, function: GraphFunction | None,
                 model: torch.nn.Module | None, *,
                 tensors: Mapping[str, torch.Tensor] | None = None) -> None:
        """``tensors`` is ``module_tensors(model)`` where the caller has it
        (``model`` is then not read). Raises EntryError where the model
        lacks a tensor the entry names."""
        self.entry = entry
        self._fn = function
        if tensors is None and model is None:
            raise WrongType("CompiledGraph needs the model or its tensors")
        live = tensors if tensors is not None else (
            module_tensors(model) if entry.attr_paths else {})
        _check_tensors(entry, live)

        def bound(s: Source) -> Any:
            return live[s.ref] if s.kind == "attr" else s.ref

        # Module tensors are resolved once: ``load_state_dict`` copies into the
        # same objects, so they stay current (binding by path every call costs
        # more than the whole replay gains over eager). Each call gathers the
        # graph's inputs in one C-level step from these bound values followed
        # by its arguments: a Python loop over the arguments costs ~25 us for
        # the ~500 a Dynamo graph of a 128-block MLP takes (its parameters
        # are arguments there).
        self._bound = tuple(bound(s) for s in entry.inputs if s.kind != "arg")
        positions, nbound = [], 0
        for s in entry.inputs:
            positions.append(len(self._bound) + s.ref if s.kind == "arg" else nbound)
            nbound += s.kind != "arg"
        self._positions = positions
        self._gather = operator.itemgetter(*positions) if len(positions) > 1 else None
        self._updates = [(u.output, u.target.kind, bound(u.target)) for u in entry.updates]
        # The output list is a copy of a template holding what is bound at
        # build time (attr / const / value / none), filled in from the
        # results and the arguments; the common case, every graph result in
        # order, is one list() call.
        outputs = entry.outputs
        self._all_results = [(s.kind, s.ref) for s in outputs] == \
            [("out", i) for i in range(len(outputs))]
        self._template = [None if s.kind in ("out", "arg") else bound(s) for s in outputs]
        self._from_results = [(i, s.ref) for i, s in enumerate(outputs) if s.kind == "out"]
        self._from_args = [(i, s.ref) for i, s in enumerate(outputs) if s.kind == "arg"]

    def __call__(self, *args: Any) -> list[Any]:
        if self._fn is None:
            results: Sequence[Any] = ()
        else:
            if self._gather is not None:
                inputs = self._gather(self._bound + args)
            else:
                inputs = [(self._bound + args)[i] for i in self._positions]
            # The profiling executor spends ~100 ms optimising on each of the
            # first two calls, and its optimised plan runs this straight-line
            # graph no faster than plain interpretation (see BENCHMARKS.md).
            # Its switch is read on every call, so it is off for every call;
            # it is thread-local, and set directly it costs a fraction of a
            # microsecond where ``torch.jit.optimized_execution`` costs ~2.
            if _get_optimize():
                _set_optimize(False)
                try:
                    results = self._fn(*inputs)
                finally:
                    _set_optimize(True)
            else:
                results = self._fn(*inputs)
        for output, kind, target in self._updates:
            if kind == "arg":
                args[target].copy_(results[output])
            else:
                with torch.no_grad():
                    target.copy_(results[output])
        if self._all_results and len(results) == len(self._template):
            return list(results)  # not when the graph also returns updated inputs
        out = self._template.copy()
        for i, ref in self._from_results:
            out[i] = results[ref]
        for i, ref in self._from_args:
            out[i] = args[ref]
        return out


_get_optimize = executor_optimize
_set_optimize = set_executor_optimize
