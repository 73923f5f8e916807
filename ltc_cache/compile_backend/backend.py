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
  inference graph is split into the regions LTC lowers and an eager rest,
  and stored as a plan, so a warm start partitions them without running
  AOTAutograd (:mod:`ltc_cache.compile_backend.plan_compile`).

A region that cannot be extracted runs eagerly with one warning; the cache
remembers it, so no later process traces it again. Graphs with symbolic
shapes (Dynamo's automatic dynamic shapes) are compiled once per concrete
shape, since an LTC graph is traced for one, in the canonical form a static
graph of that shape has too (:mod:`ltc_cache.compile_backend.specialize`).
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import fx

from ..counter_names import ATEN_OPS, DYNAMO_GRAPHS, ERRORS
from ..diagnostics import counters, warn_once
from ..entries.keys import CacheKey
from ..errors import BadArgument, first_line
from ..fx_ops import HigherOrderOperator
from ..graph.cache import GraphCache, default_cache
from ..graph.graph_keys import graph_parts, key_of
from ..threads import compile_lock
from .first_call import Guarded
from .model_names import model_name
from .nodes import node_value
from .per_shape import PerShape, is_dynamic
from .plan_compile import PlannedCompile

if TYPE_CHECKING:  # support imports FX's partitioner: only when partitioning
    from .support import OpSupport

__all__ = ["LtcBackend", "backend", "canonical", "static_graph_parts"]

logger = logging.getLogger("ltc_cache.dynamo")


class LtcBackend:
    """The ``ltc_cache`` backend of ``torch.compile``.

    ``cache`` defaults to the one the environment configures
    (:func:`ltc_cache.default_cache`), looked up at each compile so that
    ``LTC_CACHE_*`` set after import still apply. ``whole_graph`` tries the
    AOTAutograd-free inference path first. ``name`` labels the entries
    (default: the class of the compiled module). ``from_dynamo=False``: the
    graphs it is handed were not captured by Dynamo in this process (a
    loaded program's), so they are not counted as ``dynamo_graphs``.
    """

    @property
    def from_dynamo(self) -> bool:
        """Whether the graphs it is handed are Dynamo's captures in this process."""
        return self._from_dynamo

    def __init__(self, cache: GraphCache | None = None, *, whole_graph: bool = True,
                 name: str | None = None, from_dynamo: bool = True) -> None:
        self.__name__ = "ltc_cache"
        self._cache = cache
        self._whole_graph = whole_graph
        self._name = name
        self._from_dynamo = from_dynamo
        self._support: weakref.WeakKeyDictionary[GraphCache, OpSupport] = (
            weakref.WeakKeyDictionary())
        self._variants: dict[tuple[str | None, str], LtcBackend] = {}  # by torch.compile options
        self._missed: CacheKey | None = None  # the plan key `stored` found nothing under

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
            _capture_frames_once()
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
        if self._from_dynamo:
            counters.bump(DYNAMO_GRAPHS)
        from ..errors import Unspecializable

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
            raise BadArgument(f"unknown option(s) {', '.join(map(repr, unknown))} for "
                             f"backend='ltc_cache'; it accepts: {_accepted()}")
        for option, value in options.items():
            if not isinstance(value, _OPTIONS[option][0]):
                raise BadArgument(f"option {option!r} of backend='ltc_cache' takes "
                                 f"{_OPTIONS[option][1]}, not {value!r}")
        if mode:
            warn_once(f"mode:{mode}", f"torch.compile mode={mode!r} means nothing to the "
                      "ltc_cache backend (LTC compiles every graph one way); ignored")
        return LtcBackend(self._cache, whole_graph=options.get("whole_graph", self._whole_graph),
                          name=options.get("name", self._name), from_dynamo=self._from_dynamo)

    def _static(self, gm: fx.GraphModule, example_inputs: Sequence[Any], name: str, *,
                training: bool) -> Callable[..., Any]:
        cache = self.cache
        try:
            if training:
                return self._planned(cache).training(gm, example_inputs, name,
                                                     not_stored=self._missed)
            if self._whole_graph:
                compiled = self._whole(gm, example_inputs, f"{name}.inference", cache)
                if compiled is not None:
                    return compiled
            return self._planned(cache).inference(gm, example_inputs, name,
                                                  not_stored=self._missed)
        except Exception as exc:
            from ..dynamo_package import RestartAnalysis

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
            # eager (docs/torch/ltc.md#ltc-as-strided-strides-elements).
            logger.info("%s: not lowered whole (it calls as_strided); partitioning", name)
            return None
        if any(isinstance(node.target, HigherOrderOperator) for node in gm.graph.nodes):
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

    def stored(self, graph: Mapping[str, str], example_inputs: Sequence[Any],
               eager: Callable[..., Any]) -> Callable[..., Any] | None:
        """A static graph, known by its :func:`graph_parts` alone (a
        program's, which stores them), compiled from its stored training or
        inference plan without the graph itself; ``eager`` computes it should
        the plan's first call fail. None where no plan is stored, or anything
        else goes wrong: then the graph is compiled as any other
        (docs/torch/dynamo.md#program-stores-graph-key-parts). An inference
        plan is stored only where the whole graph did not lower under the
        same key, so taking it first is what compiling the graph would do."""
        from .plan import plan_key

        training = _needs_grad(example_inputs)
        cache = self.cache
        name = self._name or "graph"
        try:
            key = plan_key(key_of(graph, example_inputs), training=training)
            with compile_lock():
                planned = self._planned(cache)
                compiled = (planned.training_plan(key, name, eager) if training
                            else planned.inference_plan(key, name, eager))
        except Exception:  # the whole graph is compiled instead, which handles it
            logger.debug("%s: no plan from the stored key parts", name, exc_info=True)
            return None
        if compiled is None:
            self._missed = key
        elif self._from_dynamo:
            counters.bump(DYNAMO_GRAPHS)
        return compiled

    def _planned(self, cache: GraphCache) -> PlannedCompile:
        """The partitioned compiles of ``cache``'s graphs (:mod:`.plan_compile`)."""
        return PlannedCompile(cache, lambda: self.op_support(cache))

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


# torch.compile(..., options={...}) for this backend: name -> (type, said).
_OPTIONS: dict[str, tuple[type, str]] = {
    "name": (str, "a string: the name of the entries (default: the model's class)"),
    "whole_graph": (bool, "True or False: try an inference graph whole before partitioning"),
}


def _accepted() -> str:
    return "; ".join(f"{name} ({said})" for name, (_, said) in _OPTIONS.items())


backend = LtcBackend()

_captures_once = False  # whether Dynamo looks again before capturing a frame for this backend


def _capture_frames_once() -> None:
    """Make Dynamo capture each frame compiled for an :class:`LtcBackend`
    once, not once per thread whose first call came at the same time
    (:func:`ltc_cache.dynamo_package.look_again_before_capture`). Done on a
    backend's first graph, under ``compile_lock``: the threads that missed
    the frame meanwhile wait for that lock before they would capture it, so
    they all look again."""
    global _captures_once
    if not _captures_once:
        _captures_once = True
        try:
            from ..dynamo_package import look_again_before_capture

            look_again_before_capture(lambda fn: isinstance(fn, LtcBackend))
        except Exception:  # a torch without the pieces: each thread captures, as before
            logger.debug("Dynamo does not look again before a capture", exc_info=True)


def canonical(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> fx.GraphModule:
    """A static ``gm`` in the canonical form its keys are computed from,
    which a symbolic graph at this shape shares (:mod:`.specialize`). Raises
    :class:`~ltc_cache.compile_backend.specialize.Unspecializable`."""
    from .specialize import specialize

    return specialize(gm, example_inputs, drop_unused=False)[0]


def static_graph_parts(gm: fx.GraphModule) -> dict[str, str] | None:
    """The :func:`~ltc_cache.graph.graph_keys.graph_parts` of the graph
    :class:`LtcBackend` keys when ``gm`` is compiled, whatever the call:
    for a static graph, :func:`canonical` reads only the recorded values;
    None where the key depends on the call (symbolic shapes, ``.item()``
    of an input)."""
    from ..errors import Unspecializable
    from .specialize import scalar_inputs

    if is_dynamic(gm) or scalar_inputs(gm):
        return None
    with contextlib.suppress(Unspecializable):  # keyed as Dynamo made it, as __call__ does
        gm = canonical(gm, [node_value(n) for n in gm.graph.find_nodes(op="placeholder")])
    return graph_parts(gm)


def _needs_grad(example_inputs: Sequence[Any]) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)
