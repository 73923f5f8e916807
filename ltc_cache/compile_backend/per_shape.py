"""Graphs compiled at run time: on their first real call, outside Dynamo,
in a tracing context of their own; a graph with symbolic shapes once per
concrete input layout, as the static graph of that layout."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx

from ..threads import compile_lock
from .aot_autograd import run_time_tracing
from .nodes import is_symbolic, node_value

logger = logging.getLogger("ltc_cache.dynamo")

# How the backend compiles a static graph: ``(gm, example_inputs, name, *,
# training)`` -> the compiled callable.
CompileStatic = Callable[..., Callable[..., Any]]


def is_dynamic(gm: fx.GraphModule) -> bool:
    return any(is_symbolic(node_value(node)) for node in gm.graph.nodes
               if node.op == "placeholder")


class PerShape:
    """A Dynamo graph with symbolic shapes, compiled for each concrete input
    layout it is called with (each one is a cache entry of its own), as the
    static graph of that layout would be (:mod:`ltc_cache.compile_backend.specialize`)."""

    __slots__ = ("_compile_static", "_compiled", "_gm", "_name", "_scalars", "_training")

    def __init__(self, compile_static: CompileStatic, gm: fx.GraphModule, name: str,
                 training: bool) -> None:
        from .specialize import scalar_inputs

        self._compile_static = compile_static
        self._gm = gm
        self._name = name
        self._training = training
        self._scalars = scalar_inputs(gm)
        self._compiled: dict[tuple[Any, ...], tuple[Callable[..., Any],
                                                    Callable[..., Any]]] = {}

    def __call__(self, *args: Any) -> Any:
        signature = tuple((tuple(a.shape), a.stride()) if isinstance(a, torch.Tensor)
                          else a for a in args)
        if self._scalars:  # values the specialized graph holds as constants
            signature += tuple(args[i].item() for i in self._scalars)
        found = self._compiled.get(signature)
        if found is None:
            with compile_lock():  # one compile a shape, whatever the threads
                found = self._compiled.get(signature) or self._compile(signature, args)
        compiled, pick = found
        return compiled(*pick(args))

    def _compile(self, signature: tuple[Any, ...], args: Sequence[Any]
                 ) -> tuple[Callable[..., Any], Callable[..., Any]]:
        from ..errors import Unspecializable
        from .specialize import specialize

        logger.info("%s: compiling for shapes %s", self._name, signature)
        try:
            gm, kept = specialize(self._gm, args)
        except Unspecializable as exc:
            logger.info("%s: compiled as Dynamo made it (%s)", self._name, exc)
            gm, kept = self._gm, list(range(len(args)))

        def pick(values: Sequence[Any]) -> tuple[Any, ...]:  # the inputs the graph kept
            return tuple(values[i] for i in kept)

        with run_time_tracing():
            compiled = self._compile_static(gm, list(pick(args)), self._name,
                                            training=self._training)
        self._compiled[signature] = found = (compiled, pick)
        return found
