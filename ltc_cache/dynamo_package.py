"""Dynamo's precompile and package, as ltc_cache uses them: every use in
the package of Dynamo's AOT precompile (``torch._dynamo.aot_compile``,
``aot_compile_types``), its ``CompilePackage`` (``package``), the frame
conversion around them (``convert_frame``, ``eval_frame``, ``output_graph``,
``bytecode_transformation``, ``side_effects``, ``variables``, ``types``),
the eval-frame hook (``torch._C._dynamo``), Dynamo's settings, counters and
errors (``config``, ``utils.counters``, ``exc``), torch's structured trace
(``torch._logging``) and the graph pickler packages use
(``torch.fx._graph_pickler``) goes through this module, and no other. It
sits at the ground of the layers because ``threads.py`` (Dynamo's compile
lock) and ``compile_backend/model_names.py`` (the frame Dynamo is
compiling) need it too; ``program/`` is its main user.

Written against torch 2.13.0. None of it is public torch API: each piece is
pinned, by name and shape, in ``tests/common/test_torch_private.py``
(section "Dynamo's precompile and package"), which is where a torch upgrade
breaks first. Dynamo's guards are :mod:`.guards`'s surface, not this one's.

Importing this module imports Dynamo (seconds, in a process that has not):
the modules that import it at their top need Dynamo loaded anyway.
"""
from __future__ import annotations

import builtins
import contextlib
import inspect
import itertools
import logging
import threading
import time
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch._C._dynamo.eval_frame import (
    _debug_get_cache_entry_list,
    _FrameAction,
    _FrameExecStrategy,
    set_code_exec_strategy,
)
from torch._dynamo import bytecode_transformation, config, convert_frame, eval_frame, package
from torch._dynamo.aot_compile import AOTCompiledFunction
from torch._dynamo.aot_compile_types import SerializableCallable
from torch._dynamo.convert_frame import ConvertFrame, compile_lock
from torch._dynamo.eval_frame import OptimizedModule
from torch._dynamo.exc import PackageError, RestartAnalysis, Unsupported, UserError
from torch._dynamo.output_graph import OutputGraph
from torch._dynamo.package import CompilePackage, SourceInfo
from torch._dynamo.symbolic_convert import InstructionTranslator
from torch._dynamo.types import ConvertFrameReturn, GuardedCode
from torch._dynamo.utils import counters as dynamo_counters
from torch._logging import trace_structured

__all__ = ["SKIP", "AOTCompiledFunction", "CompilePackage", "ConvertFrame", "OptimizedModule",
           "OutputGraph", "PackageError", "RestartAnalysis", "SerializableCallable", "SourceInfo",
           "Unsupported", "UserError", "aot_compiled",
           "backend_wrapped_by", "bypassed_entry", "cache_entries", "compile_lock",
           "compiling_frame", "ddp_optimizer_off", "ddp_optimizer_on", "deserialize_program",
           "graph_break_counts", "guard_managers_built_by", "logging_functions_ignored",
           "look_again_before_capture", "module_call", "module_call_code", "optimized",
           "pickle_graph",
           "program_graph", "program_guards",
           "run_as_is", "serialize_program", "serve_frames", "side_effect_pieces",
           "skipped_recursively", "trace_artifact", "traced_fn", "unique_ids_from",
           "unpickle_graph"]

_logger = logging.getLogger("ltc_cache.dynamo")


def compiling_frame() -> Any:
    """What Dynamo is translating on this thread: its ``f_locals`` and
    ``f_code`` are the frame's (raises outside a compile)."""
    return InstructionTranslator.current_tx()


# --- one graph: the AOT precompile --------------------------------------------


def traced_fn(model: Any) -> tuple[types.FunctionType, Any]:
    """The function Dynamo traces for ``model`` and what comes first in its
    arguments (the module, for a module's forward)."""
    return convert_frame.get_traced_fn(model)


def aot_compiled(fn: types.FunctionType, backend: Callable[..., Any], guard_filter: Any,
                 args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``fn`` captured whole (one graph, static shapes) by Dynamo's AOT
    precompile for a call with ``args`` and ``kwargs``; raises what Dynamo
    raises."""
    compiled = torch.compile(fn, fullgraph=True, dynamic=False, backend=backend,
                             options={"guard_filter_fn": guard_filter})
    return compiled.aot_compile((args, kwargs))


def deserialize_program(artifact: bytes, f_globals: dict[str, Any],
                        closure: Mapping[str, Any]) -> AOTCompiledFunction:
    """A stored precompiled function, its bytecode reading ``f_globals``."""
    return AOTCompiledFunction.deserialize(artifact, f_globals=f_globals,
                                           external_closure_data=closure)


def serialize_program(compiled: Any, fn_globals: Mapping[str, Any],
                      closure: Mapping[str, Any]) -> bytes:
    """What ``torch.compile(fn).aot_compile`` made, as stored: with the
    globals its transformed bytecode reads that aot_compile does not save
    (Dynamo installs some, e.g. a module it reconstructs) taken from
    ``fn_globals``, and without the module texts of its sources (recorded
    apart: :func:`ltc_cache.program.describe.code_record`)."""
    artifacts = compiled._artifacts
    env = artifacts.runtime_env
    missing = (env.external_refs - set(env.import_sources) - set(env.used_globals)
               - {artifacts.backend_id})
    for name in missing:
        if name in fn_globals and not hasattr(builtins, name):
            env.used_globals[name] = fn_globals[name]
    artifacts.source_info = SourceInfo(inlined_sources=set())
    return AOTCompiledFunction.serialize(compiled, closure).serialized_data


def program_graph(compiled: Any) -> Any:
    """The graph a precompiled function runs (what the backend made)."""
    return compiled._artifacts.compiled_fn


def program_guards(compiled: Any) -> Any:
    """The guard manager of a precompiled function."""
    return compiled._artifacts.guard_manager


def side_effect_pieces() -> tuple[Any, ...] | None:
    """Dynamo's pieces :func:`ltc_cache.program.capture.restored_attributes_allowed`
    patches (``SideEffects``, ``AttributeMutationExisting``,
    ``is_side_effect_safe``, ``AutogradFunctionContextVariable``), or None
    where this torch lacks one (then nothing is patched)."""
    try:
        from torch._dynamo.side_effects import SideEffects
        from torch._dynamo.variables.base import AttributeMutationExisting, is_side_effect_safe
        from torch._dynamo.variables.misc import AutogradFunctionContextVariable
    except ImportError:
        return None
    needed = ("store_attr", "check_allowed_side_effect", "defer_side_effect_checks",
              "validate_deferred_attr_mutations", "should_allow_side_effects_in_hop",
              "should_allow_externally_visible_side_effects_in_subtracer")
    if not all(hasattr(SideEffects, name) for name in needed):
        return None
    return SideEffects, AttributeMutationExisting, is_side_effect_safe, \
        AutogradFunctionContextVariable


# --- one capture of a frame, however many threads miss it at once --------------

_looking_again = threading.Lock()  # installs the wrapper once
_opted_in: list[Callable[[Any], bool]] = []


def look_again_before_capture(opted_in: Callable[[Any], bool]) -> None:
    """From now on, before Dynamo captures a frame for a backend that
    ``opted_in`` accepts (the innermost one: what ``torch.compile`` was given),
    it looks again at the frame's cache entries: if one of them, added since
    the eval-frame hook looked (by another thread's capture, while this
    thread waited for ``compile_lock``), fits the frame, the frame is not
    captured again: this call runs its code as it is, the frames it calls
    only from their compiled entries, and the next call of the thread
    finds the entry. Idempotent.

    The eval-frame hook looks up a frame's entries before Dynamo's
    ``CatchErrorsWrapper`` takes ``compile_lock`` and ``ConvertFrame``
    (called under it) does not look again, so threads whose first calls
    came together each captured the frame
    (docs/torch/dynamo.md#dynamo-captures-once-per-missing-thread). The
    hook runs a frame compiled only from an entry it adds itself, so the
    entry found cannot be run for this call without a second, duplicate
    entry (each counts towards Dynamo's recompile limit): the call runs as
    the code is, as calls past that limit do."""
    with _looking_again:
        _opted_in.append(opted_in)
    _wrap_convert_frame()


def _wrap_convert_frame() -> None:
    """Wrap ``ConvertFrame.__call__`` once: frames a server takes
    (:func:`serve_frames`) are served, and frames of the opted-in backends
    (:func:`look_again_before_capture`) looked at again before a capture."""
    with _looking_again:
        if getattr(ConvertFrame.__call__, "_ltc_cache_looks_again", False):
            return
        capture = ConvertFrame.__call__

        def __call__(self: ConvertFrame, frame: Any, cache_entry: Any, hooks: Any,
                     frame_state: Any, skip: int = 0) -> Any:
            served = _served(self, frame)
            if served is not None:
                return served
            opted = bool(_opted_in) and _is_opted_in(self)
            if opted and _made_meanwhile(frame):
                return ConvertFrameReturn(
                    frame_exec_strategy=_FrameExecStrategy(_FrameAction.DEFAULT,
                                                           _FrameAction.RUN_ONLY),
                    apply_to_code=False)
            result = capture(self, frame, cache_entry, hooks, frame_state, skip=skip + 1)
            made = getattr(result, "guarded_code", None)
            if opted and made is not None:
                # The hook adds the entry once this returns, after the lock is
                # released: a thread that takes the lock meanwhile waits for it.
                _in_flight.setdefault(frame.f_code, []).append(
                    (made.guard_manager, time.monotonic()))
            return result

        __call__._ltc_cache_looks_again = True  # type: ignore[attr-defined]
        ConvertFrame.__call__ = __call__  # type: ignore[method-assign]


# --- a frame served by other code than Dynamo's capture --------------------------

# What serve_frames was given: (opted_in, server), in order.
_servers: list[tuple[Callable[[Any], bool], Callable[..., Any]]] = []
_served_names = itertools.count()


def serve_frames(opted_in: Callable[[Any], bool], server: Callable[..., Any]) -> None:
    """From now on, before Dynamo captures a frame for a backend that
    ``opted_in`` accepts, ``server(code, f_locals)`` may take the frame:
    it returns None (Dynamo captures as it would), or ``(call, guard_manager)``:
    the frame's code then has a cache entry, checked by ``guard_manager`` (a
    Dynamo guard manager, :func:`ltc_cache.program.guards.checked_by`) on
    every call, whose code is ``call(args, kwargs)``, the frame's arguments
    as they were passed (its code takes ``self, *args, **kwargs`` alone),
    run with Dynamo's frame hook off. A call the guard manager refuses is
    captured by Dynamo, as any other. Idempotent per server; anything that
    goes wrong in the server leaves the frame to Dynamo."""
    with _looking_again:
        if not any(known is server for _, known in _servers):
            _servers.append((opted_in, server))
    _wrap_convert_frame()


def module_call_code() -> types.CodeType:
    """The code of the frame Dynamo captures for ``torch.compile(module)``
    called as a module (``Module._wrapped_call_impl``)."""
    return torch.nn.Module._wrapped_call_impl.__code__


def module_call(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``module`` called as a module, past the frame Dynamo captures for it."""
    return torch.nn.Module._call_impl(module, *args, **kwargs)


def _served(convert: ConvertFrame, frame: Any) -> Any:
    """What :func:`serve_frames`'s servers make of ``frame``: a
    ``ConvertFrameReturn`` with the entry that serves it, or None."""
    if not _servers:
        return None
    try:
        code = frame.f_code
        if code.co_argcount != 1 or code.co_kwonlyargcount \
                or code.co_flags & _ARGUMENT_FLAGS != _ARGUMENT_FLAGS:
            return None  # not (self, *args, **kwargs): the call cannot be passed on as it came
        backend = eval_frame.innermost_backend(convert)
        inner = getattr(backend, "compiler_fn", backend)
        for opted_in, server in list(_servers):
            if not (opted_in(backend) or opted_in(inner)):
                continue
            taken = server(code, frame.f_locals)
            if taken is None:
                continue
            call, guard_manager = taken
            number = next(_served_names)
            name = f"__ltc_cache_served_{number}"
            serving = _calling(code, name)
            if serving is None:
                return None
            frame.f_globals[name] = torch.compiler.disable(call, recursive=True)
            # What Dynamo records of a code it made: its recompilation reasons
            # name the frame's code by it.
            convert_frame.orig_code_map[serving] = code
            convert_frame.output_codes.add(serving)
            made = GuardedCode(serving, guard_manager,
                               convert_frame.CompileId(frame_id=-1, frame_compile_id=number),
                               "ltc_cache")
            _logger.debug("%s (%s:%d): served by %s", code.co_name, code.co_filename,
                          code.co_firstlineno, getattr(server, "__qualname__", server))
            return ConvertFrameReturn(
                frame_exec_strategy=_FrameExecStrategy(_FrameAction.DEFAULT,
                                                       _FrameAction.DEFAULT),
                guarded_code=made)
    except Exception as exc:  # Dynamo captures the frame, as it would
        _logger.debug("serving a frame failed: %s: %s", type(exc).__name__, exc)
    return None


def _calling(code: types.CodeType, name: str) -> types.CodeType | None:
    """A code with ``code``'s arguments (self, args, kwargs) and free
    variables that returns ``name((self, *args), kwargs)``: the eval-frame
    hook copies a frame's arguments and free variables into the code of its
    entry by position, so they must be the same; None where ``code`` has
    cell variables (they would need to be the same too)."""
    if code.co_cellvars:
        return None
    me, args, kwargs = code.co_varnames[:3]
    frees = code.co_freevars
    text = (f"def _outer({', '.join(frees)}):\n"
            f"    def {code.co_name}({me}, *{args}, **{kwargs}):\n"
            + (f"        {', '.join(frees)}\n" if frees else "")
            + f"        return {name}(({me}, *{args}), {kwargs})\n"
            f"    return {code.co_name}\n")
    scope: dict[str, Any] = {}
    exec(compile(text, code.co_filename, "exec"), scope)
    made: types.CodeType = scope["_outer"](*([None] * len(frees))).__code__
    if made.co_freevars != frees or made.co_varnames[:3] != (me, args, kwargs) \
            or made.co_cellvars or made.co_argcount != 1 or made.co_kwonlyargcount:
        return None
    return made.replace(co_firstlineno=code.co_firstlineno)


_ARGUMENT_FLAGS = inspect.CO_VARARGS | inspect.CO_VARKEYWORDS


# Guard managers of entries a capture made, by code, until the eval-frame
# hook has added them (or _IN_FLIGHT_S has passed: a reset dropped them).
_in_flight: dict[types.CodeType, list[tuple[Any, float]]] = {}
_IN_FLIGHT_S = 0.5


def _is_opted_in(convert: ConvertFrame) -> bool:
    try:
        backend = eval_frame.innermost_backend(convert)
        inner = getattr(backend, "compiler_fn", backend)  # torch.compile(options=...)'s wrapper
        return any(wanted(backend) or wanted(inner) for wanted in _opted_in)
    except Exception:
        return False


def _entries_once_added(code: types.CodeType) -> list[Any]:
    """``code``'s cache entries, once those another thread's capture made
    are in (it adds them after releasing the compile lock, which the
    caller holds)."""
    while True:
        entries = _debug_get_cache_entry_list(code)
        waiting = [(manager, made) for manager, made in _in_flight.get(code, ())
                   if time.monotonic() < made + _IN_FLIGHT_S
                   and not any(entry.guard_manager is manager for entry in entries)]
        if not waiting:
            _in_flight.pop(code, None)
            return entries
        _in_flight[code] = waiting
        time.sleep(0.001)


def _made_meanwhile(frame: Any) -> bool:
    """Whether an entry of ``frame``'s code fits the frame; False on any
    doubt (Dynamo then captures, as it would)."""
    try:
        entries = _entries_once_added(frame.f_code)
        if not entries:
            return False
        f_locals = frame.f_locals
        for entry in entries:
            if entry.guard_manager.check(f_locals):
                _logger.debug("%s (%s:%d): compiled by another thread meanwhile; run as it is "
                              "this once", frame.f_code.co_name, frame.f_code.co_filename,
                              frame.f_code.co_firstlineno)
                return True
    except Exception as exc:  # a guard that cannot run here: Dynamo decides, as before
        _logger.debug("looking again before a capture failed: %s: %s", type(exc).__name__, exc)
    return False


# --- several frames: the package and the eval-frame hook -----------------------


# ``_FrameAction.SKIP``: run a code as it is.
SKIP = int(_FrameAction.SKIP)


def optimized(fn: types.FunctionType, backend: Callable[..., Any], package_: Any,
              guard_filter: Any) -> Callable[..., Any]:
    """``fn`` compiled through Dynamo with ``package_`` recording (or
    holding) its frames; static shapes, as a single-graph program: a new
    shape is a recompile of the frames it reaches."""
    return eval_frame.optimize(backend, package=package_, dynamic=False,
                               guard_filter_fn=guard_filter)(fn)


@contextlib.contextmanager
def backend_wrapped_by(wrapper: Callable[[Callable[..., Any]], Any]) -> Iterator[None]:
    """While :func:`optimized` runs: the backend it is given is wrapped by
    ``wrapper`` instead of Dynamo's ``get_compiler_fn``."""
    original = eval_frame.get_compiler_fn
    eval_frame.get_compiler_fn = wrapper  # type: ignore[assignment]
    try:
        yield
    finally:
        eval_frame.get_compiler_fn = original


def cache_entries(code: types.CodeType) -> list[Any]:
    """The eval-frame hook's entries for ``code`` (each compiled frame's
    code and guard manager)."""
    return _debug_get_cache_entry_list(code)


def run_as_is(code: types.CodeType, recursive_action: int) -> None:
    """Tell the eval-frame hook to run ``code`` as it is, and the frames
    it calls as ``recursive_action`` says."""
    set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction(SKIP),
                                                    _FrameAction(recursive_action)))


def skipped_recursively(result: Any) -> int | None:
    """Where Dynamo's conversion of a frame (``ConvertFrame``'s ``result``)
    decided to run its code as it is from then on: the action for the
    frames it calls; None otherwise."""
    strategy = result.frame_exec_strategy
    if result.apply_to_code and result.guarded_code is None \
            and int(strategy.cur_action) == SKIP:
        return int(strategy.recursive_action)
    return None


def unique_ids_from(start: int) -> None:
    """Move Dynamo's process-wide name counter (resume functions, the
    builtins dict) to ``start`` at least."""
    current = next(bytecode_transformation._unique_id_counter)
    bytecode_transformation._unique_id_counter = itertools.count(max(current, start))


def bypassed_entry(code: types.CodeType, module: str) -> Any:
    """A package entry for ``code`` that takes what Dynamo records of the
    frame and is stored nowhere."""
    return package._DynamoCodeCacheEntry(
        python_code=package.SerializedCode.from_code_object(code), python_module=module,
        function_names=[], guarded_codes=[], import_sources={}, backend_ids=[],
        code_source=None, install_to_global=False, bypassed=True)


@contextlib.contextmanager
def guard_managers_built_by(
        wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Iterator[None]:
    """While a package installs: each frame's guard manager is built by
    ``wrap(Dynamo's load_guard_manager)``, called as it is
    ``(guards_state, target_code, runtime_global_scope)``."""
    original = package.load_guard_manager
    package.load_guard_manager = wrap(original)
    try:
        yield
    finally:
        package.load_guard_manager = original


# -- Dynamo's settings, counters and errors, and the graphs it pickles ------


def ddp_optimizer_on() -> bool:
    """Whether Dynamo hands the graphs of a DistributedDataParallel module
    to its DDPOptimizer (``optimize_ddp``; the calling thread's setting)."""
    return config.optimize_ddp is True


def ddp_optimizer_off() -> contextlib.AbstractContextManager[Any]:
    """Dynamo with its DDPOptimizer off, in the calling thread."""
    return config.patch(optimize_ddp=False)


def logging_functions_ignored(functions: set[Any]) -> contextlib.AbstractContextManager[Any]:
    """Dynamo skipping calls of ``functions`` too, as it skips the logging
    functions it already ignores (``ignore_logging_functions``)."""
    return config.patch(ignore_logging_functions=set(config.ignore_logging_functions) | functions)


def graph_break_counts(group: str) -> Mapping[Any, int]:
    """Dynamo's counter ``group`` (``"unimplemented"``, ``"graph_break"``):
    reason -> count, as it stands."""
    return dynamo_counters[group]


def trace_artifact(name: str, payload: str) -> None:
    """A string artifact ``name`` in torch's structured trace
    (``TORCH_TRACE``), rendered only where a trace is wanted."""
    trace_structured(
        "artifact", metadata_fn=lambda: {"name": name, "encoding": "string"},
        payload_fn=lambda: payload, expect_trace_id=False)


def pickle_graph(gm: torch.fx.GraphModule) -> bytes:
    """``gm`` pickled by torch's graph pickler, every op kept."""
    from torch.fx._graph_pickler import GraphPickler, Options

    return GraphPickler.dumps(gm, Options(ops_filter=None))


def unpickle_graph(data: bytes, fake_mode: Any) -> torch.fx.GraphModule:
    """A graph :func:`pickle_graph` pickled, its values' fake tensors in
    ``fake_mode``."""
    from torch.fx._graph_pickler import GraphPickler

    return GraphPickler.loads(data, fake_mode)
