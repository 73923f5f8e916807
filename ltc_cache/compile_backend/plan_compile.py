"""Partitioned compiles: a graph from its stored plan, else through
AOTAutograd, which stores the plan it makes.

Each graph AOTAutograd makes (forward, backward or inference) is split into
LTC regions and an eager rest (:mod:`.partition`), and each region is
extracted through the cache on its first real call (AOTAutograd's compilers
get FakeTensors, docs/torch/aot-autograd.md#aot-compilers-see-fake-tensors). The partitioned graphs
are stored as a plan (:mod:`.plan`; for training the forward and backward
graphs, :mod:`.joint`), so that a warm start partitions them without
running AOTAutograd; what runs, cold or warm, is each graph as the plan
rebuilds it, so that both run the same regions.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import fx

from ..collector import holding_off
from ..counter_names import AOT_GRAPHS, AOT_TRACES, ATEN_OPS, PLAN_HITS, PLAN_MISSES
from ..diagnostics import counters, warn_once
from ..entries.keys import CacheKey
from ..errors import EntryError, UncacheableGraph
from ..graph.cache import GraphCache
from ..graph.graph_keys import compute_key
from ..threads import compile_lock
from . import (
    aot_autograd,
    plan_kind,  # noqa: F401 - registers the plan kind
)
from .first_call import Guarded, bind_regions

if TYPE_CHECKING:  # support imports FX's partitioner: only when partitioning
    from ..entries.entry import Entry
    from .joint_switch import PlanInProgress
    from .partition import Partitioned
    from .support import OpSupport

__all__ = ["PlannedCompile", "lookup_plan"]

logger = logging.getLogger("ltc_cache.dynamo")

_Rebuilt = TypeVar("_Rebuilt")


def lookup_plan(cache: GraphCache, key: CacheKey) -> Entry | None:
    """:meth:`GraphCache.lookup_entry` for a partitioning plan, counting a
    plan miss where it finds none (the backend counts the plan hits: a plan
    found may still turn out unusable)."""
    entry = cache.lookup_entry(key)
    if entry is None:
        cache.record(PLAN_MISSES)
        cache.fused.expect_work()
    return entry


def _stored_plan(cache: GraphCache, key: CacheKey,
                 rebuild: Callable[[Entry], _Rebuilt]) -> _Rebuilt | None:
    """What ``rebuild`` makes of the plan stored under ``key``; None where
    there is none, or where it is bad (then it is dropped). Its graphs are
    rebuilt with the cyclic collector held off
    (docs/torch/dynamo.md#cyclic-gc-during-warm-loads)."""
    with holding_off():
        entry = lookup_plan(cache, key)
        if entry is None:
            return None
        try:
            return rebuild(entry)
        except EntryError as exc:
            cache.drop_entry(key, f"entry {key.digest[:12]}: {exc}")
            return None


class PlannedCompile:
    """The partitioned compiles of graphs whose regions and plans live in
    ``cache``; ``support`` gives what LTC lowers there, asked only when a
    graph is partitioned."""

    def __init__(self, cache: GraphCache, support: Callable[[], OpSupport]) -> None:
        self.cache = cache
        self._support = support

    def inference(self, gm: fx.GraphModule, example_inputs: Sequence[Any], name: str, *,
                  not_stored: CacheKey | None = None) -> Callable[..., Any]:
        """Partitioned inference: from the stored plan where there is one,
        else through AOTAutograd, which stores the plan it makes.
        ``not_stored``: a plan key already looked up in vain."""
        from .plan import plan_key

        try:
            key = plan_key(compute_key(gm, example_inputs))
        except UncacheableGraph:
            return self.aot(gm, example_inputs, name)
        compiled = None if key == not_stored else self.inference_plan(key, name, gm.forward)
        if compiled is None:
            return self.aot(gm, example_inputs, name, plan=key)
        return compiled

    def inference_plan(self, key: CacheKey, name: str,
                       eager: Callable[..., Any]) -> Callable[..., Any] | None:
        """The inference graph rebuilt from the plan stored under ``key``
        (``eager`` runs should its first call fail); None where none is."""
        from .plan import plan_graph

        parted = _stored_plan(self.cache, key, plan_graph)
        if parted is None:
            return None
        logger.info("%s: running the stored plan %s", name, key.digest[:12])
        self.cache.record(PLAN_HITS)
        module = self.with_regions(parted, f"{name}.inference", plan=(key, "inference"))
        return Guarded(module.forward, eager, f"{name}.plan", self.cache, as_tuple=False, ops=0)

    def training(self, gm: fx.GraphModule, example_inputs: Sequence[Any], name: str, *,
                 not_stored: CacheKey | None = None) -> Callable[..., Any]:
        """Training: from the stored forward and backward graphs where there
        are some (:mod:`.joint`), else through AOTAutograd, which stores
        them. ``not_stored``: a plan key already looked up in vain."""
        from .plan import plan_key

        try:
            key = plan_key(compute_key(gm, example_inputs), training=True)
        except UncacheableGraph:
            return self.aot(gm, example_inputs, name)
        compiled = None if key == not_stored else self.training_plan(key, name, gm.forward)
        if compiled is None:
            return self.aot(gm, example_inputs, name, plan=key, training=True)
        return compiled

    def training_plan(self, key: CacheKey, name: str,
                      eager: Callable[..., Any]) -> Callable[..., Any] | None:
        """The training step rebuilt from the plan stored under ``key``
        (``eager`` runs should its first call fail); None where none is."""
        from .joint import JointFunction, joint_graphs

        graphs = _stored_plan(self.cache, key, joint_graphs)
        if graphs is None:
            return None
        logger.info("%s: running the stored training plan %s", name, key.digest[:12])
        self.cache.record(PLAN_HITS)
        forward, backward, layout = graphs
        joint = JointFunction(
            self.with_regions(forward, f"{name}.forward", plan=(key, "forward")),
            self.with_regions(backward, f"{name}.backward", plan=(key, "backward")),
            layout)
        return Guarded(joint, eager, f"{name}.plan", self.cache, as_tuple=False, ops=0)

    def aot(self, gm: fx.GraphModule, example_inputs: Sequence[Any], name: str, *,
            plan: CacheKey | None = None, training: bool = False) -> Callable[..., Any]:
        """Through AOTAutograd. Each graph it makes is partitioned; with
        ``plan``, the partitioned graphs are stored under that key (an
        inference plan; a training plan once the backward graph is made), and
        what runs is each as the plan rebuilds it, so that a warm process
        runs the same regions."""
        from .decompose import decompositions
        from .joint_switch import PlanInProgress

        cache = self.cache
        making = PlanInProgress()  # a training plan's forward waits here for its backward
        recomputes = _checkpointed(gm)

        def compiler(kind: str) -> Callable[..., Any]:
            @_holding(compile_lock)  # a backward compiled on its first call too
            def compile_graph(graph: fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
                counters.bump(AOT_GRAPHS)
                if kind != "backward":  # one AOTAutograd trace made it (and its backward)
                    cache.record(AOT_TRACES)
                parted = made = self._partition(graph, boxed=kind == "backward",
                                                recomputes=recomputes)
                if plan is not None:
                    parted = self._store_plan(made, kind, example_inputs, f"{name}.{kind}",
                                              plan, making, recomputes=recomputes)
                module = self.with_regions(parted, f"{name}.{kind}",
                                           plan=(plan, kind) if parted is not made else None)
                # AOTAutograd's own graph, run eagerly, is what the
                # partitioned one computes: where the latter fails on its
                # first call (forward or backward), the former runs instead.
                return aot_autograd.boxed_function(Guarded(
                    module.forward, graph.forward, f"{name}.{kind}", cache, as_tuple=False,
                    ops=0))
            return compile_graph

        aot = aot_autograd.aot_compiler(
            forward=compiler("forward"), backward=compiler("backward"),
            inference=compiler("inference"), decompositions=decompositions())
        with aot_autograd.backward_compiled_with_forward(plan is not None and training), \
                aot_autograd.compile_session():
            compiled = aot(gm, example_inputs)
        if plan is None or not training:
            return compiled
        from . import joint_switch

        # Once a training plan is made, the steps run as a warm process runs them.
        return joint_switch.joint_once_made(
            compiled, making, lambda joint, aot_fn: Guarded(
                joint, aot_fn, f"{name}.plan", cache, as_tuple=False, ops=0))

    def _store_plan(self, parted: Partitioned, kind: str, example_inputs: Sequence[Any],
                    name: str, key: CacheKey, making: PlanInProgress, *,
                    recomputes: bool = False) -> Partitioned:
        """Store ``parted`` in its plan (a training forward waits in
        ``making`` for its backward) and return it as the plan rebuilds it;
        ``parted`` itself where no plan can hold it. ``recomputes``: the
        backward recomputes checkpointed blocks (a training plan records it
        for its backward's library, :mod:`.plan_library`)."""
        from ..errors import PlanError
        from .joint import trainable
        from .joint_switch import StoredForward
        from .plan import bare_inference, partitioned_from_wire, partitioned_to_wire, plan_entry

        if kind == "backward":
            return self._store_training_plan(parted, example_inputs, name, key, making,
                                             recomputes=recomputes)
        graph = parted.module
        metadata = aot_autograd.forward_metadata()
        placeholders = sum(1 for node in graph.graph.nodes if node.op == "placeholder")
        if metadata is None or placeholders != len(example_inputs) \
                or not (trainable(metadata, example_inputs) if kind == "forward"
                        else bare_inference(graph, metadata, example_inputs)):
            logger.info("%s: no plan stored (AOTAutograd wraps this graph)", name)
            return parted
        try:
            with aot_autograd.real_tensors():  # the constants are real tensors
                wire = partitioned_to_wire(parted)
                rebuilt = partitioned_from_wire(wire)
                if kind == "forward":
                    making.forward_made(StoredForward(wire, rebuilt, metadata))
                    return rebuilt
                entry = plan_entry(wire, key, f"{name}.plan",
                                   input_kinds=_input_kinds(example_inputs))
        except (PlanError, EntryError) as exc:
            logger.info("%s: no plan stored (%s)", name, exc)
            return parted
        self.cache.store_entry(entry, key)
        return rebuilt

    def _store_training_plan(self, backward: Partitioned, example_inputs: Sequence[Any],
                             name: str, key: CacheKey, making: PlanInProgress, *,
                             recomputes: bool) -> Partitioned:
        """Store the training plan of the forward waiting in ``making`` and
        of ``backward``, and hand its modules to ``making``; ``backward``
        as the plan rebuilds it, or as it is where its forward has no plan
        or a plan cannot hold it."""
        from ..errors import PlanError
        from .joint import joint_layout
        from .plan import partitioned_from_wire, partitioned_to_wire, plan_entry

        forward = making.take_forward()
        if forward is None:  # its forward has no plan
            return backward
        try:
            with aot_autograd.real_tensors():  # the constants are real tensors
                wire = partitioned_to_wire(backward)
                rebuilt = partitioned_from_wire(wire)
                layout = joint_layout(forward.rebuilt.module, rebuilt.module, forward.metadata)
                entry = plan_entry(forward.wire, key,
                                   f"{name.rsplit('.', 1)[0]}.training.plan",
                                   backward=wire, joint=layout.to_wire(),
                                   input_kinds=_input_kinds(example_inputs),
                                   recomputes=recomputes)
        except (PlanError, EntryError) as exc:
            logger.info("%s: no plan stored (%s)", name, exc)
            return backward
        self.cache.store_entry(entry, key)
        # The modules AOTAutograd calls: JointOnceMade's.
        making.joint_made(forward.rebuilt.module, rebuilt.module, layout)
        return rebuilt

    def _partition(self, gm: fx.GraphModule, *, boxed: bool = False,
                   recomputes: bool = False) -> Partitioned:
        from .partition import partition

        return partition(gm, self._support(), boxed=boxed, recomputes=recomputes)

    def with_regions(self, parted: Partitioned, name: str,
                     plan: tuple[CacheKey, str] | None = None) -> fx.GraphModule:
        """``parted``'s module, each region replaced by a :class:`Region`
        that extracts it through the cache on its first call; with
        ``plan`` (the plan's key, and which of its graphs ``parted`` is),
        run by the plan's whole-graph library where it has one
        (:mod:`.plan_library`)."""
        counters.bump(ATEN_OPS, parted.total_ops)
        bind_regions(parted, name, self.cache)
        eager = ", ".join(f"{op} x{n}" for op, n in sorted(parted.eager_ops.items()))
        logger.info("%s: %d of %d aten ops in %d LTC regions; eager: %s", name,
                    sum(parted.region_ops.values()), parted.total_ops, len(parted.regions),
                    eager or "nothing")
        if not parted.regions and parted.total_ops:
            warn_once(f"eager-graph:{name}",
                      f"{name}: LTC lowers none of this graph's ops; it runs eagerly ({eager})")
        if plan is not None and parted.regions:
            from .plan_function import bind_plan

            bind_plan(parted.module, self.cache, *plan, name)
        return parted.module


_Fn = TypeVar("_Fn", bound=Callable[..., Any])


def _holding(lock: Callable[[], Any]) -> Callable[[_Fn], _Fn]:
    """Decorate a function to run holding ``lock()``."""
    def decorate(fn: _Fn) -> _Fn:
        @functools.wraps(fn)
        def held(*args: Any, **kwargs: Any) -> Any:
            with lock():
                return fn(*args, **kwargs)
        return held  # type: ignore[return-value]
    return decorate


def _checkpointed(gm: fx.GraphModule) -> bool:
    """Whether Dynamo's graph holds an activation-checkpointed block."""
    return any(node.op == "call_function"
               and getattr(node.target, "__name__", "") == "tag_activation_checkpoint"
               for node in gm.graph.nodes)


def _input_kinds(example_inputs: Sequence[Any]) -> list[list[bool]]:
    """Whether each input is a parameter, and whether it requires grad:
    part of their regions' keys, so that a plan's library is built against
    the regions a run binds (:mod:`.plan_library`)."""
    return [[isinstance(x, torch.nn.Parameter), bool(getattr(x, "requires_grad", False))]
            for x in example_inputs]
