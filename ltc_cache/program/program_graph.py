"""The graph inside a program: what Dynamo's AOT precompile hands the
backend, kept as a serializable callable that compiles it with the ltc_cache
backend on its first call (its LTC graphs and plan are cache entries of
their own)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._dynamo.aot_compile_types import SerializableCallable

from ..errors import EntryError


class LtcProgramGraph(SerializableCallable):
    """The Dynamo graph of a program, compiled by the ltc_cache backend on
    its first call (real tensors, outside Dynamo): its LTC graphs and plan
    are cache entries of their own, so on a warm start this is lookups and
    parses, no trace. Serialised as the graph itself (torch's graph
    pickler), with what AOTAutograd reads beside it that the pickler drops
    (each placeholder's ``_dynamo_source``)."""

    def __init__(self, gm: torch.fx.GraphModule, name: str) -> None:
        self.gm = gm
        self.name = name
        self._call: Callable[..., Any] | None = None

    @classmethod
    def serialize_compile_artifacts(cls, fn: LtcProgramGraph) -> bytes:
        import pickle

        from torch.fx._graph_pickler import GraphPickler, Options

        gm = fn.gm
        for node in gm.graph.nodes:  # not picklable, and not read by the backend
            for name in ("nn_module_stack", "source_fn_stack", "example_value"):
                node.meta.pop(name, None)
        sources = [getattr(n, "_dynamo_source", None)
                   for n in gm.graph.find_nodes(op="placeholder")]
        return pickle.dumps({
            "graph": GraphPickler.dumps(gm, Options(ops_filter=None)),
            "sources": sources,
            "param_name_to_source": getattr(gm, "_param_name_to_source", None),
            "name": fn.name,
        })

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> LtcProgramGraph:
        import pickle

        from torch._subclasses import FakeTensorMode
        from torch.fx._graph_pickler import GraphPickler
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        # Only ever reached from a program entry whose signature held.
        state = pickle.loads(data)
        gm = GraphPickler.loads(state["graph"], FakeTensorMode(shape_env=ShapeEnv()))
        placeholders = list(gm.graph.find_nodes(op="placeholder"))
        if len(placeholders) != len(state["sources"]):
            raise EntryError("program: placeholder sources do not fit the graph")
        for node, source in zip(placeholders, state["sources"], strict=True):
            node._dynamo_source = source
        if state["param_name_to_source"] is not None:
            gm._param_name_to_source = state["param_name_to_source"]
        # (The pickler's GraphModule has recompiled its code already: the
        # same code, so the same LTC cache keys; pinned by a test.)
        return cls(gm, str(state["name"]))

    def __call__(self, *args: Any) -> Any:
        call = self._call
        if call is None:
            call = self._call = self._compile(args)
        return call(*args)

    def _compile(self, args: Sequence[Any]) -> Callable[..., Any]:
        from ..compile_backend.backend import LtcBackend
        from ..compile_backend.per_shape import run_time_tracing

        # Real inputs, as Dynamo gives them, and its tracing context.
        with run_time_tracing():
            return LtcBackend(name=self.name)(self.gm, list(args))


def program_backend(name: str) -> Callable[..., LtcProgramGraph]:
    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> LtcProgramGraph:
        # Compiled on the first call, not here: aot_compile runs backends
        # under AOTAutograd-cache settings the ltc_cache backend's own
        # AOTAutograd path fails under.
        return LtcProgramGraph(gm, name)

    backend.compiler_name = "ltc_cache"  # type: ignore[attr-defined]
    return backend
