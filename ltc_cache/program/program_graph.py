"""The graph inside a program: what Dynamo's AOT precompile hands the
backend, kept as a serializable callable that compiles it with the ltc_cache
backend on its first call (its LTC graphs and plan are cache entries of
their own)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..collector import holding_off
from ..counter_names import DYNAMO_GRAPHS
from ..diagnostics import counters
from ..dynamo_package import SerializableCallable, pickle_graph, unpickle_graph
from ..errors import EntryError
from ..threads import compile_lock
from .ddp_buckets import cut_at_buckets, running_data_parallel

logger = logging.getLogger("ltc_cache.precompile")


class LtcProgramGraph(SerializableCallable):
    """The Dynamo graph of a program, compiled by the ltc_cache backend on
    its first call (real tensors, outside Dynamo): its LTC graphs and plan
    are cache entries of their own, so on a warm start this is lookups and
    parses, no trace. Serialised as the graph itself (torch's graph
    pickler), with what AOTAutograd reads beside it that the pickler drops
    (each placeholder's ``_dynamo_source``), and the graph's key parts: a
    loaded training graph finds its plan by them, and is unpickled only
    where the plan is missing or fails (docs/torch/dynamo.md#program-stores-graph-key-parts).

    The graph is counted as one of ``dynamo_graphs`` when Dynamo hands it
    over (:func:`program_backend`), not when it is compiled: a loaded
    program's was captured by the process that stored it, and counting it
    at its compile made every warm process look as if Dynamo had captured
    a frame for each program it loaded."""

    def __init__(self, gm: torch.fx.GraphModule | None, name: str, *,
                 stored: dict[str, Any] | None = None,
                 key_parts: dict[str, str] | None = None, whole: bool = True) -> None:
        self._gm = gm
        self._stored = stored  # the pickled graph and its sources, until unpickled
        self.name = name
        self.key_parts = key_parts
        self._whole = whole  # a program's graph (not a piece of one: ddp_buckets)
        self._call: Callable[..., Any] | None = None

    @property
    def gm(self) -> torch.fx.GraphModule:
        gm = self._gm
        if gm is None:
            with compile_lock():  # unpickled once, whatever the threads
                if self._gm is None:
                    assert self._stored is not None
                    self._gm, self._stored = _graph_from(self._stored), None
                gm = self._gm
        return gm

    @classmethod
    def serialize_compile_artifacts(cls, fn: LtcProgramGraph) -> bytes:
        import pickle

        from ..compile_backend.backend import static_graph_parts

        gm = fn.gm
        # Not picklable, and not read by the backend; in the graphs of
        # higher-order ops too (a checkpointed block's ``wrap_body``: its
        # values' fake mode holds weak dictionaries;
        # docs/torch/aot-autograd.md#checkpointing-adds-hop-and-rng-wrappers).
        for module in gm.modules():
            if isinstance(module, torch.fx.GraphModule):
                for node in module.graph.nodes:
                    for name in ("nn_module_stack", "source_fn_stack", "example_value"):
                        node.meta.pop(name, None)
        stored = {
            "graph": pickle_graph(gm),
            "sources": [getattr(n, "_dynamo_source", None)
                        for n in gm.graph.find_nodes(op="placeholder")],
            "param_name_to_source": getattr(gm, "_param_name_to_source", None),
        }
        try:  # the key parts of the graph as a later process unpickles it
            parts = static_graph_parts(_graph_from(stored))
        except Exception:  # then it is keyed from the graph, as before them
            logger.debug("%s: no key parts stored with the graph", fn.name, exc_info=True)
            parts = None
        return pickle.dumps({**stored, "name": fn.name, "key_parts": parts})

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> LtcProgramGraph:
        import pickle

        # Only ever reached from a program entry whose signature held.
        state = pickle.loads(data)
        stored = {k: state[k] for k in ("graph", "sources", "param_name_to_source")}
        parts = state.get("key_parts")  # programs stored before them: None
        return cls(None, str(state["name"]), stored=stored,
                   key_parts=dict(parts) if isinstance(parts, dict) else None)

    def __call__(self, *args: Any) -> Any:
        call = self._call
        if call is None:
            # Compiled once: threads calling together wait for the first,
            # then run what it compiled (outside the lock).
            with compile_lock():
                call = self._call
                if call is None:
                    call = self._call = self._compile(args)
        return call(*args)

    @holding_off()  # rebuilding the graph canonical is part of the load too
    def _compile(self, args: Sequence[Any]) -> Callable[..., Any]:
        from ..compile_backend.backend import LtcBackend
        from ..compile_backend.per_shape import run_time_tracing

        backend = LtcBackend(name=self.name, from_dynamo=False)  # counted when captured
        ddp = running_data_parallel() if self._whole else None
        if ddp is not None:
            cut = cut_at_buckets(ddp, self.gm, args, self.name, _piece)
            if cut is not None:
                return cut
        if self.key_parts is not None:
            compiled = backend.stored(self.key_parts, args, self._eager)
            if compiled is not None:
                return compiled
        # Real inputs, as Dynamo gives them, and its tracing context.
        with run_time_tracing():
            return backend(self.gm, list(args))

    def _eager(self, *args: Any) -> Any:
        gm = self.gm
        if "forward" not in type(gm).__dict__:
            # Unpickled by torch's graph pickler: its code, but no forward
            # until generated again (the same code), so a plan that failed
            # on its first call raised here instead of running eagerly.
            with compile_lock():
                if "forward" not in type(gm).__dict__:
                    gm.recompile()
        return gm.forward(*args)


def _piece(gm: torch.fx.GraphModule, name: str) -> LtcProgramGraph:
    return LtcProgramGraph(gm, name, whole=False)


@holding_off()  # docs/torch/dynamo.md#cyclic-gc-during-warm-loads
def _graph_from(stored: dict[str, Any]) -> torch.fx.GraphModule:
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from ..compile_backend.aot_autograd import fake_mode

    gm = unpickle_graph(stored["graph"], fake_mode(shape_env=ShapeEnv()))
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    if len(placeholders) != len(stored["sources"]):
        raise EntryError("program: placeholder sources do not fit the graph")
    for node, source in zip(placeholders, stored["sources"], strict=True):
        node._dynamo_source = source
    if stored["param_name_to_source"] is not None:
        gm._param_name_to_source = stored["param_name_to_source"]
    # (The pickler's GraphModule has recompiled its code already: the same
    # code, so the same LTC cache keys; pinned by a test.)
    return gm


def program_backend(name: str) -> Callable[..., LtcProgramGraph]:
    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> LtcProgramGraph:
        # Compiled on the first call, not here: aot_compile runs backends
        # under AOTAutograd-cache settings the ltc_cache backend's own
        # AOTAutograd path fails under.
        counters.bump(DYNAMO_GRAPHS)  # captured in this process
        return LtcProgramGraph(gm, name)

    backend.compiler_name = "ltc_cache"  # type: ignore[attr-defined]
    return backend
