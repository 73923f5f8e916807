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
library is (:mod:`ltc_cache.graph.fused.library_entries`). A library is kept only where it is faster
than the per-region path of the same plan on inputs laid out as the
plan's; :mod:`.plan_function` runs it, its first call in a process
compared with that path.

A graph that writes its inputs (a static key/value cache's ``copy_``,
BatchNorm's running statistics) has a library that writes them in place
too; its first call is compared with the per-region path on the inputs
as they were before either wrote them, so nothing is written twice
(:class:`~ltc_cache.graph.fused.runner.FusedFunction`). A match is kept
as a signed verdict (:mod:`ltc_cache.graph.fused.verdicts`), as a graph
library's is, and later processes run the library from their first call.

A checkpointed block's recomputed attention is called without
AOTAutograd's generator-state wrappers (:mod:`.plan_rng`), and a
recomputing backward is compiled for memory (:data:`_RECOMPUTING_BACKWARD`).

Refused, with a stored refusal: a graph that writes a view of an input, a
graph that reads a tensor's value as a number (data-dependent), one whose
recomputed ops draw random numbers, and whatever fails to compile.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..entries.entry import Entry
from ..entries.keys import CacheKey, derived_key
from ..entries.kinds import EntryKind
from ..errors import NoLibrary, Unrepeatable, WrongType
from ..fx_ops import OpOverload
from ..graph.fused.library_entries import fused_entry, refusal_entry
from ..graph.fused.platform import compiler_id, fused_key
from ..signing import program_secret
from .plan_examples import example_values
from .plan_rng import rng_state_outputs, unwrap_rng

if TYPE_CHECKING:
    from torch import fx

    from ..graph.cache import GraphCache
    from .partition import Partitioned

__all__ = [
    "ONE_REGION",
    "WRITES_A_VIEW",
    "fuse_plan",
    "fuse_plan_part",
    "fuse_stored",
    "part_key",
    "plan_part_graph",
    "plan_parts",
    "tensors_of",
    "unrepeated",
    "written_inputs",
]

logger = logging.getLogger("ltc_cache.fused")

# How a refusal's reason starts where the plan's graph writes a view of an
# input: no failure, so no warning.
WRITES_A_VIEW = "writes a view of an input"
# A plan's graph that is one region and nothing else: its library would be
# the region's own, compiled a second time.
ONE_REGION = "one region and no other op"


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
    if stored is not None and stored.kind == EntryKind.PLAN:
        return fuse_plan(cache, stored, retry=retry, timeout=timeout)
    return fuse_graph(cache, key, retry=retry, timeout=timeout)


def fuse_plan(cache: GraphCache, plan: Entry, *, retry: bool = False,
              timeout: float | None = None) -> Entry:
    """Compile and store the libraries of each graph of ``plan`` not
    stored yet (``retry``: refused ones again); the backward first, so that
    the entry returned, its first graph's (under the plan's fused key),
    says the plan is done."""
    entry: Entry | None = None
    for part in reversed(plan_parts(plan)):
        entry = fuse_plan_part(cache, plan, part, retry=retry, timeout=timeout)
    assert entry is not None
    return entry


def fuse_plan_part(cache: GraphCache, plan: Entry, part: str, *, retry: bool = False,
                   timeout: float | None = None) -> Entry:
    """The fused entry of graph ``part`` of ``plan``: the stored one, else
    (or, with ``retry``, for a refusal) compiled and stored."""
    from ..graph.fused.tier import built_within

    key = part_key(plan.key, part)
    stored = cache.lookup_entry(key, count=False)
    if stored is not None and (not retry or "library" in stored.payload):
        return stored
    secret = program_secret(cache.config.secret, cache.config.directory)
    entry = built_within(timeout, functools.partial(build_part, cache, plan, part, key, secret),
                         key, plan)
    cache.store_entry(entry, key)
    return entry


def build_part(cache: GraphCache, plan: Entry, part: str, key: CacheKey,
               secret: bytes) -> Entry:
    """The fused entry of graph ``part`` of ``plan``: its library, or a
    refusal saying why it has none."""
    from ..graph.fused.build import KEEP_PLAN, build_library, refusal_reason
    from .first_call import bind_regions

    started = time.monotonic()
    try:
        if compiler_id() == "none":
            raise NoLibrary("no C++ compiler ($CXX, else g++) on PATH")
        traced = plan_part_graph(plan, part).module
        if _one_region(traced):
            raise NoLibrary(f"{ONE_REGION}: the region's library is the same")
        writes = written_inputs(traced)
        states = rng_state_outputs(traced)
        inputs = _example_inputs(traced, _input_kinds(plan, part),
                                 example_values(cache, key.digest))
        run_strides = _saved_from_forward(cache, plan, inputs) if part == "backward" else {}
        unwrap_rng(traced, inputs)
        per_region = bind_regions(plan_part_graph(plan, part), f"{plan.graph_name}.{part}", cache)
        built = build_library(_laid_out_as_run(tensors_of(per_region, states), run_strides),
                              inputs, started=started,
                              versus="the per-region path",
                              traced=tensors_of(traced, states), writes=writes,
                              settings=_settings(plan, part), keep=KEEP_PLAN)
    except Exception as exc:  # export, Inductor, g++, a region: whatever they raise
        reason = str(exc) if isinstance(exc, NoLibrary | Unrepeatable) else refusal_reason(exc)
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
# whole step at 54 MB (docs/torch/aot-inductor.md#export-and-recomputing-backward). A user who
# checkpoints chose memory over speed; the library must still beat the regions' time.
_RECOMPUTING_BACKWARD = {"reorder_for_locality": False, "reorder_for_peak_memory": False}


# A plan's library is a whole forward or backward: its C++ wrapper (one call
# an op) is most of its compile, and at -O0 a small GPT's backward wrapper
# compiled in 8 s against 12 s at AOTInductor's -O1, while what the
# wrapper adds to a call of tens of milliseconds stays in the noise; the
# kernels keep -O3 (docs/torch/aot-inductor.md#a-library-build-is-mostly-the-wrapper-compile).
_PLAN = {"aot_inductor.compile_wrapper_opt_level": "O0"}


def _settings(plan: Entry, part: str) -> dict[str, Any]:
    recomputing = part == "backward" and plan.payload.get("recomputes") is True
    return {**_PLAN, **(_RECOMPUTING_BACKWARD if recomputing else {})}


def plan_part_graph(plan: Entry, part: str) -> Partitioned:
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
    :func:`~.buffer_writes.buffer_writes_as_one` joined BatchNorm's). Raises
    NoLibrary where an op writes a view of a value: a library would write
    where no input's copy can be put back."""
    placeholders = {node: i for i, node in
                    enumerate(graph.graph.find_nodes(op="placeholder"))}
    writes: list[int] = []
    for node in graph.graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, OpOverload) \
                or not target._schema.is_mutable:
            continue
        for argument, value in zip(target._schema.arguments, node.args, strict=False):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            for written in value if isinstance(value, list | tuple) else [value]:
                if written in placeholders:
                    writes.append(placeholders[written])
                elif _is_view(written):
                    raise NoLibrary(f"{WRITES_A_VIEW} ({target})")
    return sorted(set(writes))


def _is_view(node: Any) -> bool:
    """Whether ``node`` is an op's output that shares its input's storage."""
    target = getattr(node, "target", None)
    return isinstance(target, OpOverload) and any(
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
        raise WrongType("not a tuple")
    return items


def _example_inputs(graph: fx.GraphModule, kinds: Sequence[tuple[bool, bool]],
                    values: dict[int, torch.Tensor]) -> list[torch.Tensor]:
    """Inputs laid out as the plan recorded, parameters and requiring grad
    as ``kinds`` say: all three are part of the keys of the regions the
    per-region path binds, which must be the regions a run binds. Integer
    inputs take the ``values`` of a real call where their shape and dtype
    match (:mod:`.plan_examples`)."""
    from ..errors import FuseFailed
    from ..graph.fused.build import laid_out_input

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
            _copy_into(tensor, known)
        parameter, grad = kinds[index] if index < len(kinds) else (False, False)
        grad = grad and tensor.is_floating_point()
        if parameter:
            tensor = torch.nn.Parameter(tensor, requires_grad=grad)
        elif grad:
            tensor.requires_grad_(True)
        inputs.append(tensor)
    return inputs


def _saved_from_forward(cache: GraphCache, plan: Entry, inputs: list[torch.Tensor]
                        ) -> dict[int, tuple[int, ...]]:
    """Give a backward's saved tensors (its first inputs) the values its
    forward computes, run as a run runs it (its per-region path) on the
    forward's own example inputs; and return, by input index, the strides
    in which a run's forward hands over those it lays out otherwise than
    the plan recorded. Random saved tensors break what a backward relies on
    (docs/torch/aot-inductor.md#backward-built-on-its-forwards-values).
    The inputs keep the plan's layouts, which a library is compiled for and
    called with (docs/torch/aot-inductor.md#saved-tensors-arrive-in-another-layout);
    the per-region path is handed the run's (:func:`_laid_out_as_run`), so
    that it binds the regions a run stored rather than tracing each again
    (docs/torch/aot-inductor.md#region-key-holds-parameter-kinds). Left
    random where the forward cannot run here."""
    from .first_call import bind_regions
    from .joint import JointLayout

    try:
        forward = plan_part_graph(plan, "forward")
        layout = JointLayout.from_wire(plan.payload.get("joint"))
        values = example_values(cache, part_key(plan.key, "forward").digest)
        forward_inputs = _example_inputs(forward.module, _input_kinds(plan, "forward"), values)
        per_region = bind_regions(forward, f"{plan.graph_name}.forward", cache)
        with torch.no_grad():
            saved = list(per_region(*forward_inputs))[layout.outputs:]
    except Exception as exc:  # a forward that needs a real input's values
        logger.info("the backward of plan %s is built on random saved tensors: %s",
                    plan.key[:12], exc)
        return {}
    run_strides = {}
    with torch.no_grad():
        for index, (tensor, value) in enumerate(zip(inputs, saved, strict=False)):
            if isinstance(value, torch.Tensor) and value.shape == tensor.shape \
                    and value.dtype == tensor.dtype:
                _copy_into(tensor, value)
                if value.stride() != tensor.stride() and not tensor.requires_grad:
                    run_strides[index] = value.stride()
    return run_strides


def _laid_out_as_run(fn: Callable[..., Any], strides: dict[int, tuple[int, ...]]
                     ) -> Callable[..., Any]:
    """``fn`` called with the inputs ``strides`` names copied into those
    strides: the layouts a run's per-region path is handed."""
    if not strides:
        return fn

    def call(*args: Any) -> Any:
        args = list(args)
        for index, stride in strides.items():
            value = args[index]
            args[index] = torch.empty_strided(value.shape, stride,
                                              dtype=value.dtype).copy_(value)
        return fn(*args)
    return call


def unrepeated(tensor: torch.Tensor, stride: Sequence[int]) -> torch.Tensor:
    """``tensor`` cut to its first slice along each dimension that
    ``stride`` repeats (a stride of 0: a broadcast, BERT's position ids
    expanded over the batch). No tensor whose elements share memory can be
    written; its first slice can, and the broadcast reads it everywhere."""
    for dim, (size, step) in enumerate(zip(tensor.shape, stride, strict=True)):
        if step == 0 and size > 1:
            tensor = tensor.narrow(dim, 0, 1)
    return tensor


def _copy_into(tensor: torch.Tensor, value: torch.Tensor) -> None:
    """``value`` written into an example input (a broadcast: its first slices)."""
    stride = tensor.stride()
    unrepeated(tensor, stride).copy_(unrepeated(value, stride))


def tensors_of(fn: Callable[..., Any],
               skip: frozenset[int] = frozenset()) -> Callable[..., tuple[Any, ...]]:
    """``fn`` returning its tensor outputs alone (a library has no ``None``),
    less those at the positions ``skip`` (generator states)."""
    def tensors(*args: Any) -> tuple[Any, ...]:
        return tuple(t for i, t in enumerate(fn(*args)) if t is not None and i not in skip)
    return tensors
