"""Whole-plan libraries: a stored plan's graph compiled by AOTInductor into
one library, called in place of its regions and the eager ops between them.

A plan (:mod:`ltc_cache.compile_backend.plan`) holds AOTAutograd's graph
partitioned into LTC regions and an eager rest; its per-region path runs
each region's replay (or region library) and each eager op on its own, so
nothing fuses across a region's edge. The parent graph with its regions
inlined is AOTAutograd's whole graph again: traced by ``make_fx`` (the
regions' FX graphs run eagerly on fake tensors) and compiled as a graph
entry's library is (:func:`~.build.build_library`), with the parent
graph's inputs as the library's and its tensor outputs as its outputs (a
backward's ``None`` gradients are put back around them).

A plan has one library per graph: ``inference``, or ``forward`` and
``backward`` for a training plan. The first is stored under
:func:`~.platform.fused_key` of the plan's key (what ``ltc-cache fuse``
and the worker's queue know the plan by), the backward's under a key
derived from it; each is signed, verified and refused as a graph's
library is (:mod:`.entries`). A library is kept only where it is faster
than the per-region path of the same plan on inputs laid out as the
plan's, and its first call in a process is compared with that path.

A graph that writes its inputs (a static key/value cache's ``copy_``,
BatchNorm's running statistics) has a library that writes them in place
too; its first call is compared with the per-region path on the inputs
as they were before either wrote them, so nothing is written twice
(:class:`~ltc_cache.graph.fused.runner.FusedFunction`). A match is kept
as a signed verdict (:mod:`ltc_cache.graph.fused.verdicts`), as a graph
library's is, and later processes run the library from their first call.

Refused, with a stored refusal: a graph that writes a view of an input, a
graph that reads a tensor's value as a number (data-dependent), and
whatever fails to compile.
"""

from __future__ import annotations

import functools
import logging
import operator
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from ..diagnostics import count_event, warn_once
from ..errors import EntryError
from ..graph.entry import Entry, new_meta
from ..graph.fused.entries import (
    DATA_DEPENDENT,
    NOT_FASTER,
    fused_entry,
    refusal_entry,
    usable_library,
)
from ..graph.fused.platform import compiler_id, fused_key
from ..graph.fused.runner import FusedFunction, load_runner, mismatch, runner_available
from ..graph.fused.verdicts import RTOL, keep_verdict, verdict_held
from ..graph.keys import CacheKey, derived_key
from ..signing import program_secret
from .plan import rng_wrapper_name
from .plan_examples import Example, example_values, integer_inputs, keep_example

if TYPE_CHECKING:
    from torch import fx

    from ..graph.cache import GraphCache
    from .partition import Partitioned

__all__ = [
    "ONE_REGION",
    "PLAN_CHECKS",
    "PLAN_LOADS",
    "PLAN_QUEUED",
    "PLAN_REFUSED",
    "RANDOM_RECOMPUTED",
    "WRITES_A_VIEW",
    "PlanFunction",
    "bind_plan",
    "fuse_plan",
    "fuse_stored",
    "part_key",
    "plan_parts",
    "rng_state_outputs",
    "unwrap_rng",
    "written_inputs",
]

logger = logging.getLogger("ltc_cache.fused")

# This process's counts (ltc_cache.stats()).
PLAN_LOADS, PLAN_REFUSED, PLAN_QUEUED, PLAN_CHECKS = (
    "fused_plan_loads", "fused_plan_refused", "fused_plan_queued", "fused_plan_checks")
# How a refusal's reason starts where the plan's graph writes a view of an
# input: no failure, so no warning.
WRITES_A_VIEW = "writes a view of an input"
# A plan's graph that is one region and nothing else: its library would be
# the region's own, compiled a second time.
ONE_REGION = "one region and no other op"
# A recomputed op that draws random numbers (a checkpointed dropout): the
# library could not draw what the forward drew.
RANDOM_RECOMPUTED = "a recomputed op draws random numbers"
_QUIET = (NOT_FASTER, DATA_DEPENDENT, WRITES_A_VIEW, ONE_REGION, RANDOM_RECOMPUTED)


def plan_parts(plan: Entry) -> tuple[str, ...]:
    """The graphs of a plan entry, each of which gets a library."""
    return ("forward", "backward") if "backward" in plan.payload else ("inference",)


def part_key(plan_key: str, part: str) -> CacheKey:
    """The key of the library of ``part`` of the plan ``plan_key`` on this
    machine: the plan's :func:`fused_key` for its first graph, a key
    derived from it for a backward."""
    key = fused_key(plan_key)
    return derived_key(key, plan_part=part) if part == "backward" else key


# --- building -----------------------------------------------------------------


def fuse_stored(cache: GraphCache, key: str, *, retry: bool = False,
                timeout: float | None = None) -> Entry | None:
    """The libraries of the graph or the plan stored under ``key``, as
    the background worker and ``ltc-cache fuse`` compile them: a graph's
    with :func:`~ltc_cache.graph.fused.tier.fuse_graph`, a plan's with
    :func:`fuse_plan`. None where neither is stored."""
    from ..graph.fused.tier import fuse_graph

    stored = cache.lookup_entry(CacheKey(key, {}), count=False)
    if stored is not None and stored.kind == "plan":
        return fuse_plan(cache, stored, retry=retry, timeout=timeout)
    return fuse_graph(cache, key, retry=retry, timeout=timeout)


def fuse_plan(cache: GraphCache, plan: Entry, *, retry: bool = False,
              timeout: float | None = None) -> Entry:
    """Compile and store the libraries of each graph of ``plan`` not
    stored yet (``retry``: refused ones again); the backward first, so that
    the entry returned, its first graph's (under the plan's fused key),
    says the plan is done."""
    from ..graph.fused.tier import built_within

    secret = program_secret(cache.config.secret, cache.config.directory)
    entry: Entry | None = None
    for part in reversed(plan_parts(plan)):
        key = part_key(plan.key, part)
        stored = cache.lookup_entry(key, count=False)
        if stored is not None and (not retry or "library" in stored.payload):
            entry = stored
            continue
        entry = built_within(timeout, functools.partial(build_part, cache, plan, part, key, secret),
                             key, plan)
        cache.store_entry(entry, key)
    assert entry is not None
    return entry


def build_part(cache: GraphCache, plan: Entry, part: str, key: CacheKey,
               secret: bytes) -> Entry:
    """The fused entry of graph ``part`` of ``plan``: its library, or a
    refusal saying why it has none."""
    from ..graph.fused.build import build_library, refusal_reason
    from .first_call import bind_regions

    started = time.monotonic()
    try:
        if compiler_id() == "none":
            raise _Refused("no C++ compiler ($CXX, else g++) on PATH")
        traced = _partitioned(plan, part).module
        if _one_region(traced):
            raise _Refused(f"{ONE_REGION}: the region's library is the same")
        writes = written_inputs(traced)
        states = rng_state_outputs(traced)
        inputs = _example_inputs(traced, _input_kinds(plan, part),
                                 example_values(cache, key.digest))
        unwrap_rng(traced, inputs)
        per_region = bind_regions(_partitioned(plan, part), f"{plan.graph_name}.{part}", cache)
        built = build_library(_tensors_of(per_region, states), inputs, started=started,
                              versus="the per-region path",
                              traced=_tensors_of(traced, states), writes=writes,
                              settings=_settings(plan, part))
    except Exception as exc:  # export, Inductor, g++, a region: whatever they raise
        reason = str(exc) if isinstance(exc, _Refused) else refusal_reason(exc)
        logger.info("no library for plan %s (%s): %s", plan.key[:12], part, reason)
        return refusal_entry(key, plan, reason,
                             {"compile_seconds": round(time.monotonic() - started, 2)})
    if built.slower is not None:
        return refusal_entry(key, plan, built.slower, built.stats)
    return fused_entry(key, plan, library=built.library, isa=built.isa, aliases=built.aliases,
                       restride=built.restride, secret=secret, stats=built.stats)


# Inductor settings for the backward of a plan that recomputes checkpointed
# blocks: its schedule as AOTAutograd ordered it. Inductor's reorderings
# keep the recomputed blocks alive together: a checkpointed Llama's backward
# library peaked at 102 MB over its start, 51 MB with both off, eager's
# whole step at 54 MB (fact 85 in docs/design.md). A user who checkpoints
# chose memory over speed; the library must still beat the regions' time.
_RECOMPUTING_BACKWARD = {"reorder_for_locality": False, "reorder_for_peak_memory": False}


def _settings(plan: Entry, part: str) -> dict[str, Any]:
    return dict(_RECOMPUTING_BACKWARD) if part == "backward" \
        and plan.payload.get("recomputes") is True else {}


class _Refused(Exception):
    """Why a graph gets no library, known before compiling it."""


def _partitioned(plan: Entry, part: str) -> Partitioned:
    """A fresh copy of graph ``part`` of ``plan``, its nodes' values made."""
    from .plan import partitioned_from_wire

    return partitioned_from_wire(plan.payload.get("backward" if part == "backward" else "plan"))


def _one_region(graph: fx.GraphModule) -> bool:
    """Whether ``graph`` calls one region and no op but picking its outputs."""
    import operator

    calls = [node for node in graph.graph.nodes
             if node.op in ("call_module", "call_function", "call_method")]
    return sum(node.op == "call_module" for node in calls) == 1 and all(
        node.op == "call_module" or node.target is operator.getitem for node in calls)


def written_inputs(graph: fx.GraphModule) -> list[int]:
    """The indices of the inputs ``graph`` writes in place (AOTAutograd
    writes an input with ``copy_`` into it, and ``_foreach_copy_`` where
    :func:`~.partition.buffer_writes_as_one` joined BatchNorm's). Raises
    _Refused where an op writes a view of a value: a library would write
    where no input's copy can be put back."""
    placeholders = {node: i for i, node in
                    enumerate(graph.graph.find_nodes(op="placeholder"))}
    writes: list[int] = []
    for node in graph.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload) \
                or not target._schema.is_mutable:
            continue
        for argument, value in zip(target._schema.arguments, node.args, strict=False):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            for written in value if isinstance(value, list | tuple) else [value]:
                if written in placeholders:
                    writes.append(placeholders[written])
                elif _is_view(written):
                    raise _Refused(f"{WRITES_A_VIEW} ({target})")
    return sorted(set(writes))


def rng_state_outputs(graph: fx.GraphModule) -> frozenset[int]:
    """The positions of ``graph``'s outputs that are the generator states
    ``run_and_save_rng_state`` saved for a recomputation (fact 61 in
    docs/design.md). A library leaves them out: its caller returns the
    generator's state at the call in their place, what the wrapper
    returns where the op it wraps draws nothing (:func:`unwrap_rng`)."""
    out = graph.graph.find_nodes(op="output")[0].args[0]
    return frozenset(i for i, node in enumerate(out if isinstance(out, list | tuple) else ())
                     if _state_of_rng_wrapper(node))


def _state_of_rng_wrapper(node: Any) -> bool:
    return getattr(node, "target", None) is operator.getitem and node.args[1] == 0 \
        and rng_wrapper_name(node.args[0].target) == "run_and_save_rng_state"


def unwrap_rng(graph: fx.GraphModule, inputs: list[torch.Tensor]) -> None:
    """Call the ops AOTAutograd wrapped in ``run_and_save_rng_state`` and
    ``run_with_rng_state`` directly, and return None for the states saved:
    ``torch.export`` has no rule for either wrapper. Sound only where the op
    draws nothing; an op with a ``dropout_p`` of 0, what a checkpointed
    attention block's ``scaled_dot_product_attention`` is in training, is
    the one kind known to. Raises _Refused for any other. The states
    ``inputs`` hold for ``run_with_rng_state`` become the generator's:
    the per-region path the library is checked against sets them."""
    nodes = graph.graph
    placeholders = list(nodes.find_nodes(op="placeholder"))
    out_node = nodes.find_nodes(op="output")[0]
    for node in list(nodes.nodes):
        name = rng_wrapper_name(node.target) if node.op == "call_function" else None
        if name is None:
            continue
        op, *args = node.args if name == "run_and_save_rng_state" else node.args[1:]
        if not _draws_nothing(op, args, node.kwargs):
            raise _Refused(f"{RANDOM_RECOMPUTED}: {op}")
        with nodes.inserting_before(node):
            call = nodes.call_function(op, tuple(args), dict(node.kwargs))
        call.meta = dict(node.meta)
        if name == "run_with_rng_state":
            if node.args[0] in placeholders:
                inputs[placeholders.index(node.args[0])] = torch.get_rng_state()
            node.replace_all_uses_with(call)
        else:
            for use in list(node.users):
                if use.args[1] == 1:
                    use.replace_all_uses_with(call)
                else:
                    out_node.args = torch.fx.node.map_arg(
                        out_node.args, lambda n, state=use: None if n is state else n)
                nodes.erase_node(use)
        nodes.erase_node(node)
    graph.recompile()


def _draws_nothing(op: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """Whether ``op`` called on these arguments has a ``dropout_p`` of 0."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return False
    for position, argument in enumerate(schema.arguments):
        if argument.name == "dropout_p":
            value = kwargs.get("dropout_p", args[position] if position < len(args)
                               else argument.default_value)
            return value == 0
    return False


def _is_view(node: Any) -> bool:
    """Whether ``node`` is an op's output that shares its input's storage."""
    target = getattr(node, "target", None)
    return isinstance(target, torch._ops.OpOverload) and any(
        r.alias_info is not None for r in target._schema.returns)


def _input_kinds(plan: Entry, part: str) -> list[tuple[bool, bool]]:
    """Whether each input of graph ``part`` is a parameter and requires
    grad, as in a run (the plan stores its forward's, or inference
    graph's; empty for a plan stored without). A backward's inputs are the
    forward's saved tensors, then the tangents: a saved input of the
    forward comes back as itself, anything else detached."""
    kinds = plan.payload.get("input_kinds")
    if not isinstance(kinds, list):
        return []
    forward = [(k[0] is True, k[1] is True) if isinstance(k, list) and len(k) == 2
               else (False, False) for k in kinds]
    if part != "backward":
        return forward
    joint, wire = plan.payload.get("joint"), plan.payload.get("plan")
    try:
        nodes = wire["graph"]["nodes"]
        placeholders = [n[1] for n in nodes if n[0] == "placeholder"]
        outputs = _untupled(_untupled(nodes[-1][3])[0])  # the output node's args: ((a, b),)
        saved = outputs[int(joint["outputs"]):]
    except (KeyError, IndexError, TypeError, ValueError):
        return []
    result = []
    for out in saved:
        name = out.get("node") if isinstance(out, dict) else None
        index = placeholders.index(name) if name in placeholders else -1
        result.append(forward[index] if 0 <= index < len(forward) else (False, False))
    return result


def _untupled(wire: Any) -> list[Any]:
    """A tuple's or a list's items, from their wire form."""
    items = wire.get("tuple") if isinstance(wire, dict) else wire
    if not isinstance(items, list):
        raise TypeError("not a tuple")
    return items


def _example_inputs(graph: fx.GraphModule, kinds: Sequence[tuple[bool, bool]],
                    values: dict[int, torch.Tensor]) -> list[torch.Tensor]:
    """Inputs laid out as the plan recorded, parameters and requiring grad
    as ``kinds`` say: all three are part of the keys of the regions the
    per-region path binds, which must be the regions a run binds. Integer
    inputs take the ``values`` of a real call where their shape and dtype
    match (:mod:`.plan_examples`)."""
    from ..graph.fused.build import FuseFailed, laid_out_input

    generator = torch.Generator().manual_seed(0)
    inputs = []
    for index, node in enumerate(graph.graph.find_nodes(op="placeholder")):
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor) or value.device.type not in ("cpu", "meta"):
            raise FuseFailed(f"input {node.name} is no CPU tensor of a recorded layout")
        tensor = laid_out_input(str(value.dtype).removeprefix("torch."), list(value.shape),
                                list(value.stride()), generator=generator)
        known = values.get(index)
        if known is not None and known.shape == tensor.shape and known.dtype == tensor.dtype:
            tensor.copy_(known)
        parameter, grad = kinds[index] if index < len(kinds) else (False, False)
        grad = grad and tensor.is_floating_point()
        if parameter:
            tensor = torch.nn.Parameter(tensor, requires_grad=grad)
        elif grad:
            tensor.requires_grad_(True)
        inputs.append(tensor)
    return inputs


def _tensors_of(fn: Callable[..., Any],
                skip: frozenset[int] = frozenset()) -> Callable[..., tuple[Any, ...]]:
    """``fn`` returning its tensor outputs alone (a library has no ``None``),
    less those at the positions ``skip`` (generator states)."""
    def tensors(*args: Any) -> tuple[Any, ...]:
        return tuple(t for i, t in enumerate(fn(*args)) if t is not None and i not in skip)
    return tensors


# --- running ------------------------------------------------------------------


def bind_plan(module: fx.GraphModule, cache: GraphCache, plan_key: CacheKey, part: str,
              name: str) -> None:
    """Make ``module`` (graph ``part`` of the plan stored under
    ``plan_key``, its regions bound) run through :class:`PlanFunction`."""
    if cache.config.fuse == "off":
        return
    try:
        writes = written_inputs(module)
    except _Refused:  # its build refuses it too
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


class PlanFunction:
    """A plan's graph, through the plan's library where one is stored,
    verified and loadable, and its per-region path otherwise. A library
    whose first call in some process matched the per-region path (a
    verdict is kept) runs from this process's first call; any other is
    decided after a first call of the per-region path, and its own first
    call is compared with that path. Where none is stored, the plan is
    queued for the background worker, or compiled at once under
    ``LTC_CACHE_FUSE=sync``, after that first call, so that its regions
    are stored (and queued) before it."""

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
                self._call = self._decided(args, None, checked_only=True)
            if self._call is None:
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
                 checked_only: bool = False) -> Callable[..., Any] | None:
        """What runs from now on (``checked_only``: the library where its
        verdict is held, else None). Never raises."""
        try:
            return self._obtain(args, example, checked_only)
        except Exception as exc:  # a store, a loader: never the user's failure
            self._cache.record("errors")
            warn_once("fused-plan", f"the fused library of {self._name}: {exc}; running its "
                      "regions")
            return self._per_region

    def _obtain(self, args: Sequence[Any], example: Example,
                checked_only: bool) -> Callable[..., Any] | None:
        cache, config, outputs = self._cache, self._cache.config, self._outputs
        if not runner_available() or outputs.container is None:
            logger.info("%s: no plan library (no tuple of outputs)", self._name)
            return self._per_region
        key = part_key(self._plan_key.digest, self._part)
        stored = cache.lookup_entry(key, count=False)
        if checked_only and stored is None:
            return None
        if stored is None:
            keep_example(cache, key.digest, example)
        if stored is None and config.fuse == "sync" and not cache.readonly:
            from ..graph.fused.tier import in_a_clean_thread

            in_a_clean_thread(fuse_stored, cache, self._plan_key.digest)
            stored = cache.lookup_entry(key, count=False)
        if stored is None:
            self._cache.fused.queue(self._plan_key.digest, PLAN_QUEUED)
            return self._per_region
        secret = program_secret(config.secret, config.directory)
        try:
            library = usable_library(stored, secret, self._plan_key.digest)
        except EntryError as exc:
            cache.drop_entry(key, str(exc), remade="compiled")
            return self._per_region
        signature = bytes(stored.payload["hmac"]) if library is not None else b""
        checked = library is not None and verdict_held(cache, key.digest,
                                                       self._plan_key.digest, signature)
        if checked_only and not checked:
            return None
        if library is None:
            reason = str(stored.payload.get("reason", ""))
            logger.info("%s: plan library refused: %s", self._name, reason[:300])
            if not reason.startswith(_QUIET):
                warn_once("fused-plan-refused", f"no fused library for {self._name} "
                          f"({self._plan_key.digest[:12]}): {reason[:300]}; running its regions "
                          "(`ltc-cache show` and `ltc-cache fuse --retry`)")
            return self._per_region
        plan = cache.lookup_entry(self._plan_key, count=False)
        strides = _input_strides(plan, self._part) if plan is not None else None
        if strides is None or len(strides) != len(args):
            logger.info("%s: no plan library (no recorded input layouts)", self._name)
            return self._per_region
        runner = _LaidOutRunner(load_runner(library.data), strides, self._writes)
        count_event(PLAN_LOADS)
        logger.info("%s: running the plan library %s", self._name, key.digest[:12])
        fused = FusedFunction(runner, _tensors_of(self._per_region, outputs.states),
                              aliases=library.aliases, restride=library.restride,
                              writes=self._writes, checked=checked,
                              check=lambda expected, got, error: self._checked(
                                  key, signature, expected, got, error))
        inputs_returned = [(int(o), int(i)) for o, kind, i, *_ in library.aliases
                           if kind == "in" and int(i) in outputs.inputs]
        return _WithNones(fused, outputs, inputs_returned)

    def _checked(self, key: CacheKey, signature: bytes, expected: Sequence[Any],
                 got: Sequence[Any] | None, error: Exception | None) -> bool:
        """The verdict on the library's first call: kept where its outputs
        match the per-region path's, refused for good where they differ
        (or it raised)."""
        count_event(PLAN_CHECKS)
        problem = mismatch(expected, got, rtol=RTOL, error=error)
        if problem is None:
            keep_verdict(self._cache, key.digest, self._plan_key.digest, signature)
            return True
        count_event(PLAN_REFUSED)
        warn_once(f"fused:{key.digest}", f"the fused library of {self._name} "
                  f"({self._plan_key.digest[:12]}) is not used: {problem}; running its regions")
        plan = Entry(self._plan_key.digest, "", (), (), (),
                     new_meta(graph_name=self._name, node_count=0, graph_hash="",
                              key_parts=self._plan_key.parts), kind="plan")
        self._cache.store_entry(refusal_entry(key, plan, f"on first use: {problem}"), key)
        return False



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
    strides it was compiled with (fact 66 in docs/design.md). What the
    library wrote into such a copy is copied back into the input."""

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
    return torch.empty_strided(value.shape, stride, dtype=value.dtype,
                               device=value.device).copy_(value)


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
