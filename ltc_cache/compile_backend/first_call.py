"""What runs a compiled graph: a first call that chooses what every later
call runs (one attribute and a call), the LTC replay guarded by eager
where its first call fails, a partitioned graph's regions extracted on
their first real call, and a region run eagerly in its traced layout."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import fx

from ..counter_names import ERRORS, LTC_OPS
from ..diagnostics import counters, warn_once
from ..errors import first_line
from ..graph.replay import CompiledGraph
from .aot_autograd import real_tensors
from .nodes import is_symbolic

if TYPE_CHECKING:
    from ..graph.cache import GraphCache
    from .graph_wire import StoredRegion
    from .partition import Partitioned

logger = logging.getLogger("ltc_cache.dynamo")


class FirstCall:
    """A compiled graph (``name``, of ``ops`` LTC ops) whose first call
    (``_first``) chooses what runs from then on (``_call``), so that a
    later call is one attribute and a call; ``cache`` counts what goes wrong.

    Threads whose calls come before the choice is made wait for the one
    making it, then call what it chose: one extraction, one first replay
    (and, should it fail, one warning and one error counted). The lock is
    reentrant, and taken by first calls only."""

    __slots__ = ("_cache", "_call", "_lock", "_name", "_ops")

    def __init__(self, name: str, ops: int, cache: GraphCache) -> None:
        self._name = name
        self._ops = ops
        self._cache = cache
        self._lock = threading.RLock()
        self._call: Callable[..., Any] = self._first_call

    def __call__(self, *args: Any) -> Any:
        return self._call(*args)

    def _first_call(self, *args: Any) -> Any:
        with self._lock:
            if self._call == self._first_call:  # still undecided: this thread decides
                return self._first(*args)
        return self._call(*args)

    def _first(self, *args: Any) -> Any:
        raise NotImplementedError


class Guarded(FirstCall):
    """Runs ``compiled`` and, should its first call fail (a stored graph that
    does not run here), ``fallback`` from then on, with one warning."""

    __slots__ = ("_compiled", "_fallback", "_wrap")

    def __init__(self, compiled: Callable[..., Any], fallback: Callable[..., Any], name: str,
                 cache: GraphCache, *, as_tuple: bool, ops: int) -> None:
        super().__init__(name, ops, cache)
        self._compiled = compiled
        self._fallback = fallback
        self._wrap = as_tuple

    def _first(self, *args: Any) -> Any:
        try:
            out = self._compiled(*args)
        except Exception as exc:  # whatever it is, eager computes the graph
            logger.debug("%s: first replay failed", self._name, exc_info=True)
            warn_once(f"replay:{self._name}", f"{self._name}: the compiled graph does not run "
                      f"({type(exc).__name__}: {first_line(exc)}); running it eagerly")
            self._cache.record(ERRORS)
            if isinstance(self._compiled, CompiledGraph):
                # Remembered, so no later process fails the same way.
                try:
                    self._cache.remember_replay_failure(self._compiled, exc)
                except Exception:
                    logger.debug("%s: cannot store the negative entry", self._name,
                                 exc_info=True)
            self._call = self._fallback
            return self._fallback(*args)
        counters.bump(LTC_OPS, self._ops)
        compiled = self._compiled
        self._call = (lambda *a: tuple(compiled(*a))) if self._wrap else compiled
        return tuple(out) if self._wrap else out


class Region(FirstCall):
    """One LTC region of a partitioned graph: extracted through the cache on
    its first call, when real tensors arrive; returns a tuple, as the fused
    submodule it replaces does. A region of a stored plan
    (:class:`~ltc_cache.compile_backend.graph_wire.StoredRegion`) is keyed by the
    digest the plan holds and its graph built only to trace it or to run
    it eagerly."""

    __slots__ = ("_module",)

    def __init__(self, module: fx.GraphModule | StoredRegion, name: str, ops: int,
                 cache: GraphCache) -> None:
        super().__init__(name, ops, cache)
        self._module = module

    def _graph(self) -> fx.GraphModule:
        module = self._module
        return module if isinstance(module, fx.GraphModule) else module.graph_module()

    def _eager(self, *args: Any) -> Any:
        """The region run eagerly, from then on (built on the first call)."""
        self._call = eager_region(self._graph())
        return self._call(*args)

    def _first(self, *args: Any) -> Any:
        module = self._module
        stored = not isinstance(module, fx.GraphModule)
        try:
            # AOTAutograd may run the compiled function under a dispatch mode;
            # lazy tracing inside one fails
            # (docs/torch/aot-autograd.md#lazy-tracing-fails-under-a-dispatch-mode).
            with real_tensors(), torch.no_grad():
                compiled = self._cache.extract_compiled_graph(
                    self._graph if stored else module, args, name=self._name,
                    digest=module.digest if stored else None,
                    tensors=module.constants if stored else None)
        except Exception as exc:  # a region LTC cannot take runs eagerly, whatever the error
            logger.debug("%s: extraction failed", self._name, exc_info=True)
            warn_once(f"eager-region:{self._name}",
                      f"{self._name}: LTC cannot extract this region; it runs eagerly "
                      f"({first_line(exc)})")
            return self._eager(*args)
        self._call = Guarded(compiled, self._eager, self._name, self._cache,
                              as_tuple=True, ops=self._ops)
        return self._call(*args)


def eager_region(module: fx.GraphModule) -> Callable[..., Any]:
    """``module``, a region, run eagerly on its inputs laid out as it was
    traced. AOTAutograd traced it on fake tensors with eager's strides, and
    its ``view``s rely on them, while the LTC region before it may hand back
    a contiguous tensor where eager's was a transposed view (and CPU flash
    attention between them returns its output in its query's layout), so a
    region that falls back to eager, run on the LTC layout, fails on its
    first ``view`` (docs/torch/ltc.md#flash-attention-output-follows-query-layout)."""
    strides = []
    for node in module.graph.find_nodes(op="placeholder"):
        value = node.meta.get("val")
        laid_out = isinstance(value, torch.Tensor) and not is_symbolic(value)
        strides.append(tuple(value.stride()) if laid_out else None)
    if not any(strides):
        return module

    def run(*args: Any) -> Any:
        # A region writes none of its inputs (ops that mutate stay out of
        # regions), so a copy of one in the traced layout is safe.
        return module(*[_laid_out(arg, stride) for arg, stride in zip(args, strides,
                                                                       strict=False)])

    return run


def _laid_out(value: Any, stride: tuple[int, ...] | None) -> Any:
    if stride is None or not isinstance(value, torch.Tensor) or value.stride() == stride \
            or len(stride) != value.dim():
        return value
    return torch.empty_strided(value.shape, stride, dtype=value.dtype,
                               device=value.device).copy_(value)


def bind_regions(parted: Partitioned, name: str, cache: GraphCache) -> fx.GraphModule:
    """``parted``'s module, each region replaced by a :class:`Region` that
    extracts it through the cache on its first call (or replays it, or runs
    its library, as a warm process does)."""
    for index, region in enumerate(parted.regions):
        submodule = parted.module.get_submodule(region)
        delattr(parted.module, region)
        setattr(parted.module, region, Region(submodule, f"{name}.r{index}",
                                               parted.region_ops[region], cache))
    return parted.module
