"""A stored plan's graph run through its whole-plan library
(:mod:`.plan_library`), or through its regions where it has none.

:func:`bind_plan` makes a plan's graph, its regions bound, a
:class:`PlanFunction`: the library where one is stored, verified and
loadable, from its first call, which is compared with the per-region path
unless a verdict is kept (:mod:`ltc_cache.graph.fused.verdicts`); the
per-region path otherwise, with the plan queued for the background worker.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from ..counter_names import (
    ERRORS,
    FUSED_PLAN_CHECKS,
    FUSED_PLAN_LOADS,
    FUSED_PLAN_QUEUED,
    FUSED_PLAN_REFUSED,
)
from ..diagnostics import warn_once
from ..entries.entry import Entry
from ..errors import NoLibrary
from ..graph.fused.library_entries import DATA_DEPENDENT, NOT_FASTER
from ..graph.fused.platform import fusable_here
from ..graph.fused.runner import FusedFunction, load_runner
from ..graph.fused.slot import LibrarySlot, SlotCounters
from ..graph.fused.tier import regions_as_reference
from .plan_examples import Example, integer_inputs, keep_example
from .plan_library import (
    ONE_REGION,
    WRITES_A_VIEW,
    fuse_stored,
    part_key,
    tensors_of,
    unrepeated,
    written_inputs,
)
from .plan_rng import RANDOM_RECOMPUTED, rng_state_outputs

if TYPE_CHECKING:
    from torch import fx

    from ..entries.keys import CacheKey
    from ..graph.cache import GraphCache

logger = logging.getLogger("ltc_cache.fused")

__all__ = ["PlanFunction", "bind_plan"]


def bind_plan(module: fx.GraphModule, cache: GraphCache, plan_key: CacheKey, part: str,
              name: str) -> None:
    """Make ``module`` (graph ``part`` of the plan stored under
    ``plan_key``, its regions bound) run through :class:`PlanFunction`."""
    if cache.config.fuse == "off":
        return
    try:
        writes = written_inputs(module)
    except NoLibrary:  # its build refuses it too
        return
    module.forward = PlanFunction(module.forward, cache, plan_key, part, name, writes,
                                  _Outputs.of(module))


class _Outputs(NamedTuple):
    """What a plan's graph returns, read from its output node: how many,
    in what container, which are ``None``, which are generator states
    (:func:`rng_state_outputs`) and which are its inputs as they are
    (AOTAutograd's graphs return a tuple or list of tensors and ``None``;
    ``container`` is None for anything else)."""

    total: int
    container: type | None
    nones: frozenset[int]
    states: frozenset[int]
    inputs: frozenset[int]  # the positions of the inputs returned

    @classmethod
    def of(cls, graph: fx.GraphModule) -> _Outputs:
        out = graph.graph.find_nodes(op="output")[0].args[0]
        if not isinstance(out, list | tuple):
            return cls(0, None, frozenset(), frozenset(), frozenset())
        placeholders = list(graph.graph.find_nodes(op="placeholder"))
        return cls(len(out), type(out), frozenset(i for i, n in enumerate(out) if n is None),
                   rng_state_outputs(graph),
                   frozenset(placeholders.index(n) for n in out if n in placeholders))


# Refusals that are no failure: no warning.
_QUIET = (NOT_FASTER, DATA_DEPENDENT, WRITES_A_VIEW, ONE_REGION, RANDOM_RECOMPUTED)
_COUNTERS = SlotCounters(loads=FUSED_PLAN_LOADS, checks=FUSED_PLAN_CHECKS,
                         refused=FUSED_PLAN_REFUSED)


class PlanFunction:
    """A plan's graph, through the plan's library where one is stored,
    verified and loadable, and its per-region path otherwise, decided on
    the first call. A library's first call in a process is compared with
    the per-region path (:class:`FusedFunction`) unless a verdict is kept,
    in which case the plan's regions are never run. Where nothing is
    stored yet, the first call runs the per-region path, after which the
    plan is queued for the background worker, or compiled at once under
    ``LTC_CACHE_FUSE=sync``, so that its regions are stored (and queued)
    before it."""

    __slots__ = ("_cache", "_call", "_lock", "_name", "_outputs", "_part", "_per_region",
                 "_plan_key", "_writes")

    def __init__(self, per_region: Callable[..., Any], cache: GraphCache, plan_key: CacheKey,
                 part: str, name: str, writes: Sequence[int], outputs: _Outputs) -> None:
        self._per_region = per_region
        self._writes = tuple(writes)
        self._outputs = outputs
        self._cache = cache
        self._plan_key = plan_key
        self._part = part
        self._name = name
        self._lock = threading.Lock()
        self._call: Callable[..., Any] | None = None

    def __call__(self, *args: Any) -> Any:
        call = self._call
        if call is not None:
            return call(*args)
        if not _plain(args):  # fake tensors of a trace around the call: no decision yet
            return self._per_region(*args)
        with self._lock:
            if self._call is None:
                self._call = self._decided(args, None, ahead=True)
            if self._call is None:  # nothing stored yet
                example = integer_inputs(args)  # before the call writes any of them
                out = self._per_region(*args)
                self._call = self._decided(args, example)
                return out
        return self._call(*args)

    def boxed(self, per_region: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
        """This function called on a list it empties (a backward's saved
        tensors, :mod:`ltc_cache.compile_backend.boxed`): ``per_region``,
        the graph's boxed form, frees each input after its last use; a
        library takes them all at once."""
        def call(inputs: list[Any]) -> Any:
            if self._call is self._per_region:
                return per_region(inputs)
            args = tuple(inputs)
            inputs.clear()
            return self(*args)
        return call

    def _decided(self, args: Sequence[Any], example: Example, *,
                 ahead: bool = False) -> Callable[..., Any] | None:
        """What runs from now on; ``ahead`` (before the first call): None
        where the plan has no fused entry yet. Never raises."""
        try:
            return self._obtain(args, example, ahead)
        except Exception as exc:  # a store, a loader: never the user's failure
            self._cache.record(ERRORS)
            warn_once("fused-plan", f"the fused library of {self._name}: {exc}; running its "
                      "regions")
            return self._per_region

    def _obtain(self, args: Sequence[Any], example: Example,
                ahead: bool) -> Callable[..., Any] | None:
        cache, config, outputs = self._cache, self._cache.config, self._outputs
        if not fusable_here() or outputs.container is None:
            logger.info("%s: no plan library (no tuple of outputs)", self._name)
            return self._per_region
        key = part_key(self._plan_key.digest, self._part)
        stored = cache.lookup_entry(key, count=False)
        if stored is None:
            if ahead:
                return None
            keep_example(cache, key.digest, example)
            if config.fuse == "sync" and not cache.readonly:
                from ..graph.fused.tier import in_a_clean_thread

                in_a_clean_thread(fuse_stored, cache, self._plan_key.digest)
                stored = cache.lookup_entry(key, count=False)
            if stored is None:
                self._cache.fused.queue(self._plan_key.digest, FUSED_PLAN_QUEUED)
                return self._per_region
        plan = cache.lookup_entry(self._plan_key, count=False)
        if plan is None:
            logger.info("%s: no plan library (the plan is gone)", self._name)
            return self._per_region
        slot = LibrarySlot(cache, key, plan, self._plan_key.digest, self._name, _COUNTERS,
                           instead="running its regions", quiet=_QUIET,
                           refused_warning="fused-plan-refused")
        library = slot.library(stored)
        if library is None:
            return self._per_region
        strides = _input_strides(plan, self._part)
        if strides is None or len(strides) != len(args):
            logger.info("%s: no plan library (no recorded input layouts)", self._name)
            return self._per_region
        runner = _LaidOutRunner(load_runner(library.data), strides, self._writes)
        logger.info("%s: running the plan library %s", self._name, key.digest[:12])
        fused = slot.function(stored, library, runner,
                              _as_reference(tensors_of(self._per_region, outputs.states)),
                              writes=self._writes)
        inputs_returned = [(int(o), int(i)) for o, kind, i, *_ in library.aliases
                           if kind == "in" and int(i) in outputs.inputs]
        return _WithNones(fused, outputs, inputs_returned)


def _as_reference(per_region: Callable[..., Any]) -> Callable[..., Any]:
    """``per_region`` as the library's reference: the regions it first runs
    are not queued for libraries of their own (the plan's runs for them)."""
    def run(*args: Any) -> Any:
        with regions_as_reference():
            return per_region(*args)
    return run


def _input_strides(plan: Entry, part: str) -> list[tuple[int, ...] | None] | None:
    """The stride of each input of graph ``part`` as the plan recorded it
    (None for an input of no tensor value), read from the wire form; None
    where the entry is malformed."""
    graph = plan.payload.get("backward" if part == "backward" else "plan")
    nodes = graph.get("graph", {}).get("nodes") if isinstance(graph, dict) else None
    if not isinstance(nodes, list):
        return None
    strides: list[tuple[int, ...] | None] = []
    for node in nodes:
        if not (isinstance(node, list) and len(node) == 6) or node[0] != "placeholder":
            continue
        value = node[5]
        layout = value.get("tensor") if isinstance(value, dict) else None
        if isinstance(layout, list) and len(layout) == 3 and isinstance(layout[2], list) \
                and all(type(d) is int for d in layout[2]):
            strides.append(tuple(layout[2]))
        else:
            strides.append(None)
    return strides


class _LaidOutRunner:
    """A library's runner handed its inputs in the layout it was compiled
    for: the plan's recorded one. A backward's saved tensors come from the
    forward's regions, contiguous where eager's (and the recorded
    layout) were transposed views, and a library reads its inputs by the
    strides it was compiled with
    (docs/torch/aot-inductor.md#saved-tensors-arrive-in-another-layout). What the library wrote into
    such a copy is copied back into the input."""

    __slots__ = ("_runner", "_strides", "_writes")

    def __init__(self, runner: Any, strides: Sequence[tuple[int, ...] | None],
                 writes: Sequence[int]) -> None:
        self._runner = runner
        self._strides = strides
        self._writes = writes

    def run(self, inputs: list[Any]) -> list[Any]:
        laid = [_laid_out(t, stride) for t, stride in zip(inputs, self._strides, strict=True)]
        out = self._runner.run(laid)
        for i in self._writes:
            if laid[i] is not inputs[i]:
                inputs[i].copy_(laid[i])
        return out


def _laid_out(value: Any, stride: tuple[int, ...] | None) -> Any:
    if stride is None or value.stride() == stride or len(stride) != value.dim() \
            or value.numel() <= 1:
        return value
    # A layout with a stride of 0 was a broadcast in eager, saved for the
    # backward; the regions hand it back materialised, its values repeated
    # along those dimensions: one slice is laid out and expanded again.
    base = unrepeated(value, stride)
    laid = torch.empty_strided(base.shape, stride, dtype=value.dtype,
                               device=value.device).copy_(base)
    return laid if base is value else laid.expand(value.shape)


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _plain(args: Sequence[Any]) -> bool:
    """Real tensors, as a library takes (no fake tensor, no subclass)."""
    return all(type(t) in _PLAIN for t in args)


class _WithNones:
    """A library's tensor outputs with the graph's ``None`` outputs and
    generator states (:func:`rng_state_outputs`) put back, and the inputs
    the graph returns as they are (a forward's saved weights) returned as
    themselves, not as views of themselves: a saved parameter comes back to
    the backward as itself, whose regions are keyed by it."""

    __slots__ = ("_fused", "_inputs_returned", "_outputs")

    def __init__(self, fused: FusedFunction, outputs: _Outputs,
                 inputs_returned: list[tuple[int, int]]) -> None:
        self._fused = fused
        self._outputs = outputs
        self._inputs_returned = inputs_returned

    @property
    def in_use(self) -> bool:
        return self._fused.in_use

    def __call__(self, *args: Any) -> Any:
        tensors = self._fused(*args)
        if self._inputs_returned:
            tensors = list(tensors)
            for o, i in self._inputs_returned:
                t, arg = tensors[o], args[i]
                if t.shape == arg.shape and t.stride() == arg.stride() \
                        and t.storage_offset() == arg.storage_offset():
                    tensors[o] = arg
        outputs = self._outputs
        if not outputs.nones and not outputs.states:
            return outputs.container(tensors)
        flowing = iter(tensors)
        return outputs.container([None if i in outputs.nones else torch.get_rng_state()
                                  if i in outputs.states else next(flowing)
                                  for i in range(outputs.total)])
