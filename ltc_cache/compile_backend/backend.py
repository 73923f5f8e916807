"""``torch.compile(model, backend="ltc_cache")``: TorchDynamo graphs through
LTC and the cache.

Two paths, chosen per Dynamo graph:

- Inference (grad disabled, or no input needs grad): the whole Dynamo graph
  is extracted as it is, with no AOTAutograd. A warm start is then Dynamo's
  capture, one key, one lookup and one parse. A graph LTC cannot lower whole
  is remembered as a negative entry and takes the second path, in this
  process and every later one.
- Otherwise (training, or inference that needs partitioning): AOTAutograd with
  :func:`ltc_cache.compile_backend.decompose.decompositions`; each forward, backward or
  inference graph is split into the regions LTC lowers and an eager rest
  (:mod:`ltc_cache.compile_backend.partition`), and each region is extracted through the
  cache on its first real call (the compilers get FakeTensors, fact 6 in
  docs/design.md). AOTAutograd's graphs are stored as a plan
  (:mod:`ltc_cache.compile_backend.plan`; for training the forward and backward graphs,
  :mod:`ltc_cache.compile_backend.joint`), so a warm start partitions them without running
  AOTAutograd.

A region that cannot be extracted runs eagerly with one warning; the cache
remembers it, so no later process traces it again. Graphs with symbolic
shapes (Dynamo's automatic dynamic shapes) are compiled once per concrete
shape, since an LTC graph is traced for one, in the canonical form a static
graph of that shape has too (:mod:`ltc_cache.compile_backend.specialize`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import fx
from torch.utils._python_dispatch import _disable_current_modes

from ..collector import holding_off
from ..counter_names import (
    AOT_GRAPHS,
    AOT_TRACES,
    ATEN_OPS,
    DYNAMO_GRAPHS,
    ERRORS,
    PLAN_HITS,
    PLAN_MISSES,
)
from ..diagnostics import counters, warn_once
from ..errors import EntryError, UncacheableGraph, first_line
from ..graph.cache import GraphCache, default_cache
from ..graph.keys import CacheKey, compute_key, graph_parts, key_of
from ..threads import compile_lock
from .first_call import LTC_OPS, Guarded, bind_regions
from .model_names import model_name
from .nodes import node_value
from .per_shape import PerShape, is_dynamic, run_time_tracing

if TYPE_CHECKING:  # support imports FX's partitioner: only when partitioning
    from ..graph.entry import Entry
    from .partition import Partitioned
    from .support import OpSupport

__all__ = ["AOT_GRAPHS", "AOT_TRACES", "ATEN_OPS", "DYNAMO_GRAPHS", "LTC_OPS", "PLAN_HITS",
           "PLAN_MISSES", "LtcBackend", "backend", "lookup_plan", "run_time_tracing"]

logger = logging.getLogger("ltc_cache.dynamo")

# The backend's counters (ATEN_OPS, AOT_GRAPHS, AOT_TRACES, PLAN_HITS,
# PLAN_MISSES, DYNAMO_GRAPHS, LTC_OPS) are declared, with what each counts,
# in counter_names.py.


_Rebuilt = TypeVar("_Rebuilt")


def lookup_plan(cache: GraphCache, key: CacheKey) -> Entry | None:
    """:meth:`GraphCache.lookup_entry` for a partitioning plan, counting a
    plan miss where it finds none (the backend counts the plan hits: a plan
    found may still turn out unusable)."""
    entry = cache.lookup_entry(key)
    if entry is None:
        cache.record(PLAN_MISSES)
    return entry


def _stored_plan(cache: GraphCache, key: CacheKey,
                 rebuild: Callable[[Entry], _Rebuilt]) -> _Rebuilt | None:
    """What ``rebuild`` makes of the plan stored under ``key``; None where
    there is none, or where it is bad (then it is dropped). Its graphs are
    rebuilt with the cyclic collector held off (fact 46 in docs/design.md)."""
    with holding_off():
        entry = lookup_plan(cache, key)
        if entry is None:
            return None
        try:
            return rebuild(entry)
        except EntryError as exc:
            cache.drop_entry(key, f"entry {key.digest[:12]}: {exc}")
            return None


class LtcBackend:
    """The ``ltc_cache`` backend of ``torch.compile``.

    ``cache`` defaults to the one the environment configures
    (:func:`ltc_cache.default_cache`), looked up at each compile so that
    ``LTC_CACHE_*`` set after import still apply. ``whole_graph`` tries the
    AOTAutograd-free inference path first. ``name`` labels the entries
    (default: the class of the compiled module).
    """

    def __init__(self, cache: GraphCache | None = None, *, whole_graph: bool = True,
                 name: str | None = None) -> None:
        self.__name__ = "ltc_cache"
        self._cache = cache
        self._whole_graph = whole_graph
        self._name = name
        self._support: weakref.WeakKeyDictionary[GraphCache, OpSupport] = (
            weakref.WeakKeyDictionary())
        self._variants: dict[tuple[str | None, str], LtcBackend] = {}  # by torch.compile options
        self._missed: CacheKey | None = None  # the plan key stored_training found nothing under

    @property
    def cache(self) -> GraphCache:
        return self._cache if self._cache is not None else default_cache()

    def __deepcopy__(self, memo: dict[int, Any]) -> LtcBackend:
        # A backend is shared, as a function is: Lightning's torch.compile
        # wrapper deep-copies the arguments of every call, backend included.
        return self

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any], *,
                 mode: str | None = None, options: dict[str, Any] | None = None,
                 **kwargs: Any) -> Callable[..., Any]:
        # Dynamo calls a backend holding this lock already; a graph compiled
        # on its first call (a program's, a shape of a symbolic one) takes
        # it here: AOTAutograd and the rest are not thread-safe.
        with compile_lock():
            return self._compile(gm, example_inputs, mode=mode, options=options, **kwargs)

    def _compile(self, gm: fx.GraphModule, example_inputs: Sequence[Any], *,
                 mode: str | None, options: dict[str, Any] | None,
                 **kwargs: Any) -> Callable[..., Any]:
        if options or mode or kwargs:
            # torch.compile(..., mode=, options=) hands them to the backend.
            settings = {**(options or {}), **kwargs}
            variant = (mode, repr(sorted(settings.items(), key=lambda item: item[0])))
            configured = self._variants.get(variant)
            if configured is None:  # one per setting: it keeps what it learned of LTC
                configured = self._variants[variant] = self._configured(mode, settings)
            return configured(gm, example_inputs)
        counters.bump(DYNAMO_GRAPHS)
        from .specialize import Unspecializable

        name = self._name or model_name(gm)
        training = _needs_grad(example_inputs)
        if is_dynamic(gm):
            return PerShape(self._static, gm, name, training)
        try:
            gm = canonical(gm, example_inputs)
        except Unspecializable as exc:
            logger.info("%s: compiled as Dynamo made it (%s)", name, exc)
        return self._static(gm, example_inputs, name, training=training)

    def _configured(self, mode: str | None, options: dict[str, Any]) -> LtcBackend:
        """This backend with torch.compile's ``options`` applied; an unknown
        option is an error (a typo must not pass for a setting), a ``mode``
        warns once: Inductor's modes mean nothing to LTC."""
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise ValueError(f"unknown option(s) {', '.join(map(repr, unknown))} for "
                             f"backend='ltc_cache'; it accepts: {_accepted()}")
        for option, value in options.items():
            if not isinstance(value, _OPTIONS[option][0]):
                raise ValueError(f"option {option!r} of backend='ltc_cache' takes "
                                 f"{_OPTIONS[option][1]}, not {value!r}")
        if mode:
            warn_once(f"mode:{mode}", f"torch.compile mode={mode!r} means nothing to the "
                      "ltc_cache backend (LTC compiles every graph one way); ignored")
        return LtcBackend(self._cache, whole_graph=options.get("whole_graph", self._whole_graph),
                          name=options.get("name", self._name))

    def _static(self, gm: fx.GraphModule, example_inputs: Sequence[Any], name: str, *,
                training: bool) -> Callable[..., Any]:
        cache = self.cache
        try:
            if training:
                return self._training(gm, example_inputs, name, cache)
            if self._whole_graph:
                compiled = self._whole(gm, example_inputs, f"{name}.inference", cache)
                if compiled is not None:
                    return compiled
            return self._inference(gm, example_inputs, name, cache)
        except Exception as exc:
            from torch._dynamo.exc import RestartAnalysis

            if isinstance(exc, RestartAnalysis):  # Dynamo's own control flow
                raise
            # The graph is the user's code: eager always computes it.
            logger.debug("%s: compiling failed", name, exc_info=True)
            warn_once(f"backend:{name}", f"{name}: cannot compile this graph "
                      f"({type(exc).__name__}: {first_line(exc)}); it runs eagerly")
            cache.record(ERRORS)
            return gm.forward

    def _whole(self, gm: fx.GraphModule, example_inputs: Sequence[Any], name: str,
               cache: GraphCache) -> Callable[..., Any] | None:
        if any("as_strided" in str(node.target) for node in gm.graph.nodes):
            # LTC strides the elements in logical order, eager the storage;
            # the partitioner keeps each as_strided where they would differ
            # eager (fact 45 in docs/design.md).
            logger.info("%s: not lowered whole (it calls as_strided); partitioning", name)
            return None
        if any(isinstance(node.target, torch._ops.HigherOrderOperator) for node in gm.graph.nodes):
            # A checkpointed block (tag_activation_checkpoint) would run
            # torch.utils.checkpoint on LTC's device, which it has no module
            # for; AOTAutograd inlines such blocks.
            logger.info("%s: not lowered whole (it calls a higher-order op); partitioning", name)
            return None
        try:
            with torch.no_grad():
                compiled = cache.extract_compiled_graph(gm, example_inputs, name=name)
        except RuntimeError as exc:
            # Expected for most real models (an op LTC cannot lower); the
            # cache remembers it and the next process partitions at once.
            logger.info("%s: not lowered whole (%s); partitioning", name, first_line(exc))
            return None
        # Everything runs in LTC; counted as the aten ops of the stored IR.
        ops = compiled.entry.ir.count("aten::")
        counters.bump(ATEN_OPS, ops)
        return Guarded(compiled, gm.forward, name, cache, as_tuple=False, ops=ops)

    def _inference(self, gm: fx.GraphModule, example_inputs: Sequence[Any], name: str,
                   cache: GraphCache) -> Callable[..., Any]:
        """Partitioned inference: from the stored plan where there is one,
        else through AOTAutograd, which stores the plan it makes."""
        from .plan import plan_graph, plan_key

        try:
            key = plan_key(compute_key(gm, example_inputs))
        except UncacheableGraph:
            return self._aot(gm, example_inputs, name, cache)
        parted = _stored_plan(cache, key, plan_graph)
        if parted is None:
            return self._aot(gm, example_inputs, name, cache, plan=key)
        logger.info("%s: running the stored plan %s", name, key.digest[:12])
        cache.record(PLAN_HITS)
        module = self._with_regions(parted, f"{name}.inference", cache, plan=(key, "inference"))
        return Guarded(module.forward, gm.forward, f"{name}.plan", cache, as_tuple=False, ops=0)

    def _training(self, gm: fx.GraphModule, example_inputs: Sequence[Any], name: str,
                  cache: GraphCache) -> Callable[..., Any]:
        """Training: from the stored forward and backward graphs where there
        are some (:mod:`ltc_cache.compile_backend.joint`), else through AOTAutograd, which
        stores them."""
        from .plan import plan_key

        try:
            key = plan_key(compute_key(gm, example_inputs), training=True)
        except UncacheableGraph:
            return self._aot(gm, example_inputs, name, cache)
        # (Not looked up again where stored_training found none under it.)
        compiled = None if key == self._missed else self._training_plan(key, name, cache,
                                                                         gm.forward)
        if compiled is None:
            return self._aot(gm, example_inputs, name, cache, plan=key, training=True)
        return compiled

    def _training_plan(self, key: CacheKey, name: str, cache: GraphCache,
                       eager: Callable[..., Any]) -> Callable[..., Any] | None:
        """The training step rebuilt from the plan stored under ``key``
        (``eager`` runs should its first call fail); None where none is."""
        from .joint import JointFunction, joint_graphs

        graphs = _stored_plan(cache, key, joint_graphs)
        if graphs is None:
            return None
        logger.info("%s: running the stored training plan %s", name, key.digest[:12])
        cache.record(PLAN_HITS)
        forward, backward, layout = graphs
        joint = JointFunction(
            self._with_regions(forward, f"{name}.forward", cache, plan=(key, "forward")),
            self._with_regions(backward, f"{name}.backward", cache, plan=(key, "backward")),
            layout)
        return Guarded(joint, eager, f"{name}.plan", cache, as_tuple=False, ops=0)

    def stored_training(self, graph: Mapping[str, str], example_inputs: Sequence[Any],
                        eager: Callable[..., Any]) -> Callable[..., Any] | None:
        """A static training graph, known by its :func:`graph_parts` alone
        (a program's, which stores them), compiled from its stored training
        plan without the graph itself; ``eager`` computes it should the
        plan's first call fail. None where the call needs no gradient, no
        plan is stored, or anything else goes wrong: then the graph is
        compiled as any other (fact 47 in docs/design.md)."""
        from .plan import plan_key

        if not _needs_grad(example_inputs):
            return None
        cache = self.cache
        name = self._name or "graph"
        try:
            key = plan_key(key_of(graph, example_inputs), training=True)
            with compile_lock():
                compiled = self._training_plan(key, name, cache, eager)
        except Exception:  # the whole graph is compiled instead, which handles it
            logger.debug("%s: no plan from the stored key parts", name, exc_info=True)
            return None
        if compiled is None:
            self._missed = key
        else:
            counters.bump(DYNAMO_GRAPHS)
        return compiled

    def _aot(self, gm: fx.GraphModule, example_inputs: Sequence[Any], name: str,
             cache: GraphCache, *, plan: CacheKey | None = None,
             training: bool = False) -> Callable[..., Any]:
        """Through AOTAutograd. Each graph it makes is partitioned; with
        ``plan``, the partitioned graphs are stored under that key (an
        inference plan; a training plan once the backward graph is made), and
        what runs is each as the plan rebuilds it, so that a warm process
        runs the same regions."""
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd

        from .decompose import decompositions

        pending: dict[str, Any] = {}  # a forward graph waiting for its backward
        recomputes = _checkpointed(gm)

        def compiler(kind: str) -> Callable[..., Any]:
            @_holding(compile_lock)  # a backward compiled on its first call too
            def compile_graph(graph: fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
                counters.bump(AOT_GRAPHS)
                if kind != "backward":  # one AOTAutograd trace made it (and its backward)
                    cache.record(AOT_TRACES)
                parted = made = self._partition(graph, cache, boxed=kind == "backward")
                if plan is not None:
                    parted = self._planned(made, kind, example_inputs, f"{name}.{kind}", cache,
                                           plan, pending, recomputes=recomputes)
                module = self._with_regions(parted, f"{name}.{kind}", cache,
                                            plan=(plan, kind) if parted is not made else None)
                # AOTAutograd's own graph, run eagerly, is what the
                # partitioned one computes: where the latter fails on its
                # first call (forward or backward), the former runs instead.
                return make_boxed_func(Guarded(module.forward, graph.forward,
                                                f"{name}.{kind}", cache, as_tuple=False, ops=0))
            return compile_graph

        aot = aot_autograd(
            fw_compiler=compiler("forward"),
            bw_compiler=compiler("backward"),
            inference_compiler=compiler("inference"),
            decompositions=decompositions(),
            # An input the graph updates (a static key/value cache's
            # index_copy_) is written by the graph's own copy_, an eager op
            # a plan holds, not by AOTAutograd's runtime wrapper.
            keep_inference_input_mutations=True,
        )
        with _backward_compiled_with_forward(plan is not None and training), \
                _compile_session():
            compiled = aot(gm, example_inputs)
        if plan is None or not training:
            return compiled
        from . import joint_switch

        # Once a training plan is made, the steps run as a warm process runs them.
        return joint_switch.joint_once_made(
            compiled, pending, lambda joint, aot_fn: Guarded(
                joint, aot_fn, f"{name}.plan", cache, as_tuple=False, ops=0))

    def _planned(self, parted: Partitioned, kind: str, example_inputs: Sequence[Any],
                 name: str, cache: GraphCache, key: CacheKey,
                 pending: dict[str, Any], *, recomputes: bool = False) -> Partitioned:
        """Store ``parted`` in its plan (a forward waits in ``pending`` for
        its backward) and return it as the plan rebuilds it; ``parted``
        itself where no plan can hold it. ``recomputes``: the backward
        recomputes checkpointed blocks (a training plan records it for
        its backward's library, :mod:`.plan_library`)."""
        from torch._guards import TracingContext

        from .graph_wire import PlanError
        from .joint import joint_layout, trainable
        from .plan import bare_inference, partitioned_from_wire, partitioned_to_wire, plan_entry

        metadata = None
        graph = parted.module
        if kind == "backward":
            forward = pending.pop("forward", None)
            if forward is None:  # its forward has no plan
                return parted
        else:
            context = TracingContext.try_get()
            metadata = context.fw_metadata if context is not None else None
            placeholders = sum(1 for node in graph.graph.nodes if node.op == "placeholder")
            if metadata is None or placeholders != len(example_inputs) \
                    or not (trainable(metadata, example_inputs) if kind == "forward"
                            else bare_inference(graph, metadata, example_inputs)):
                logger.info("%s: no plan stored (AOTAutograd wraps this graph)", name)
                return parted
        try:
            with _disable_current_modes():  # the constants are real tensors
                wire = partitioned_to_wire(parted)
                rebuilt = partitioned_from_wire(wire)
                if kind == "forward":
                    pending["forward"] = (wire, rebuilt, metadata)
                    return rebuilt
                if kind == "backward":
                    forward_wire, forward_parted, metadata = forward
                    layout = joint_layout(forward_parted.module, rebuilt.module, metadata)
                    entry = plan_entry(forward_wire, key,
                                       f"{name.rsplit('.', 1)[0]}.training.plan",
                                       backward=wire, joint=layout.to_wire(),
                                       input_kinds=_input_kinds(example_inputs),
                                       recomputes=recomputes)
                else:
                    entry = plan_entry(wire, key, f"{name}.plan",
                                       input_kinds=_input_kinds(example_inputs))
        except (PlanError, EntryError) as exc:
            logger.info("%s: no plan stored (%s)", name, exc)
            return parted
        cache.store_entry(entry, key)
        if kind == "backward":  # the modules AOTAutograd calls: JointOnceMade's
            pending["joint"] = (forward_parted.module, rebuilt.module, layout)
        return rebuilt

    def op_support(self, cache: GraphCache | None = None) -> OpSupport:
        """What LTC lowers, as learned and remembered in ``cache`` (default:
        :attr:`cache`)."""
        from .support import OpSupport

        cache = cache or self.cache
        support = self._support.get(cache)
        if support is None:
            # cache.readonly also covers a directory found unwritable on opening.
            support = OpSupport(cache.store, readonly=cache.readonly)
            self._support[cache] = support
        return support

    def _partition(self, gm: fx.GraphModule, cache: GraphCache, *,
                   boxed: bool = False) -> Partitioned:
        from .partition import partition

        return partition(gm, self.op_support(cache), boxed=boxed)

    def _with_regions(self, parted: Partitioned, name: str, cache: GraphCache,
                      plan: tuple[CacheKey, str] | None = None) -> fx.GraphModule:
        """``parted``'s module, each region replaced by a :class:`Region`
        that extracts it through the cache on its first call; with
        ``plan`` (the plan's key, and which of its graphs ``parted`` is),
        run by the plan's whole-graph library where it has one
        (:mod:`ltc_cache.compile_backend.plan_library`)."""
        counters.bump(ATEN_OPS, parted.total_ops)
        bind_regions(parted, name, cache)
        eager = ", ".join(f"{op} x{n}" for op, n in sorted(parted.eager_ops.items()))
        logger.info("%s: %d of %d aten ops in %d LTC regions; eager: %s", name,
                    sum(parted.region_ops.values()), parted.total_ops, len(parted.regions),
                    eager or "nothing")
        if not parted.regions and parted.total_ops:
            warn_once(f"eager-graph:{name}",
                      f"{name}: LTC lowers none of this graph's ops; it runs eagerly ({eager})")
        if plan is not None and parted.regions:
            from .plan_function import bind_plan

            bind_plan(parted.module, cache, *plan, name)
        return parted.module


# torch.compile(..., options={...}) for this backend: name -> (type, said).
_OPTIONS: dict[str, tuple[type, str]] = {
    "name": (str, "a string: the name of the entries (default: the model's class)"),
    "whole_graph": (bool, "True or False: try an inference graph whole before partitioning"),
}


def _accepted() -> str:
    return "; ".join(f"{name} ({said})" for name, (_, said) in _OPTIONS.items())


backend = LtcBackend()


def _backward_compiled_with_forward(wanted: bool) -> contextlib.AbstractContextManager[Any]:
    """AOTAutograd compiles a backward graph on its first backward call, so a
    graph whose outputs get no gradient in the cold process (one of
    Longformer's) stored no training plan, and every warm start ran
    AOTAutograd for it. Its private switch (pinned by
    tests/compile_backend/test_plan.py) compiles the backward with the
    forward, and so stores the plan, whatever the step's backward reaches
    (fact 43 in docs/design.md)."""
    from torch._functorch import config

    if not wanted or not hasattr(config, "force_non_lazy_backward_lowering"):
        return contextlib.nullcontext()
    return config.patch(force_non_lazy_backward_lowering=True)


def _compile_session() -> contextlib.AbstractContextManager[Any]:
    """AOTAutograd traces with FX, which flags "FX is tracing" for the whole
    process (``torch.fx._symbolic_trace._is_fx_tracing_flag``). A
    ``torch.compile``'d function called meanwhile in another thread takes
    that for an FX trace of itself and raises ("Detected that you are using
    FX to symbolically trace a dynamo-optimized function"), unless Dynamo is
    compiling: Dynamo marks its compile sessions process-wide too, and calls
    the backend inside one. A graph compiled on its first call (a
    program's, a shape of a symbolic one) is traced outside Dynamo, so its
    trace is made a compile session of its own; inside Dynamo's, this
    changes nothing (fact 55 in docs/design.md)."""
    return torch.compiler._compile_session_context()


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


def canonical(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> fx.GraphModule:
    """A static ``gm`` in the canonical form its keys are computed from,
    which a symbolic graph at this shape shares (:mod:`.specialize`). Raises
    :class:`~ltc_cache.compile_backend.specialize.Unspecializable`."""
    from .specialize import specialize

    return specialize(gm, example_inputs, drop_unused=False)[0]


def static_graph_parts(gm: fx.GraphModule) -> dict[str, str] | None:
    """The :func:`~ltc_cache.graph.keys.graph_parts` of the graph
    :class:`LtcBackend` keys when ``gm`` is compiled, whatever the call:
    for a static graph, :func:`canonical` reads only the recorded values;
    None where the key depends on the call (symbolic shapes, ``.item()``
    of an input)."""
    from .specialize import Unspecializable, scalar_inputs

    if is_dynamic(gm) or scalar_inputs(gm):
        return None
    with contextlib.suppress(Unspecializable):  # keyed as Dynamo made it, as __call__ does
        gm = canonical(gm, [node_value(n) for n in gm.graph.find_nodes(op="placeholder")])
    return graph_parts(gm)


def _checkpointed(gm: fx.GraphModule) -> bool:
    """Whether Dynamo's graph holds an activation-checkpointed block."""
    return any(node.op == "call_function"
               and getattr(node.target, "__name__", "") == "tag_activation_checkpoint"
               for node in gm.graph.nodes)


def _input_kinds(example_inputs: Sequence[Any]) -> list[list[bool]]:
    """Whether each input is a parameter, and whether it requires grad:
    part of their regions' keys, so that a plan's library is built against
    the regions a run binds (:mod:`ltc_cache.compile_backend.plan_library`)."""
    return [[isinstance(x, torch.nn.Parameter), bool(getattr(x, "requires_grad", False))]
            for x in example_inputs]


def _needs_grad(example_inputs: Sequence[Any]) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)
