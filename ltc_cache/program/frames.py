"""Programs of several frames: a function Dynamo compiles with graph breaks.

Dynamo's AOT precompile (:mod:`ltc_cache.precompile`) takes one graph only.
A function with a graph break is compiled as several frames: the function
itself, cut at the break, and one *resume function* for the rest, each with
its own graph and guards (and so on for each break). torch 2.13 records
those in a ``CompilePackage`` (``torch._dynamo.package``) when one is handed
to ``torch._dynamo.optimize``: every frame's original code, its transformed
bytecode and guards, the resume functions' code, and the backend of each
graph. ``CompilePackage.install`` puts them back, in a later process, as
*precompile entries* on each code object, which the eval-frame hook checks
before it would capture. So a warm process captures nothing, and a frame
whose entries do not fit (a new shape, a failing check) is captured again
alone, by Dynamo, as any recompile.

This module keeps what ``ltc_cache.compile`` promises of a program:

- the sources of every function Dynamo traced in any frame are recorded
  (:func:`ltc_cache.program.code_record`) and compared on load, instead of
  Dynamo's own record (whole module texts it never compares);
- guards Dynamo cannot save become portable checks per frame, added to that
  frame's guard manager (live in the capturing process, and on install in a
  later one) as one lambda guard that resolves them on its first call;
- the artifact (the package's state and every frame's graph) is signed with
  the program's key and unpickled only once the signature holds;
- names the package installs in module globals (resume functions, Dynamo's
  builtins dict) are kept clear of Dynamo's later captures in the process
  (:func:`ltc_cache.frame_names.advance_unique_ids`): torch 2.13 names them from a process-wide
  counter, and a recompile after a load would otherwise reuse one and fail
  (``Name '__builtins_dict___0' already exists in scope``).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import pickle
import sys
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..errors import Unportable, first_line
from ..graph.keys import CacheKey
from .describe import code_record
from .entries import ProgramParts, program_entry
from .frame_names import SKIP, advance_unique_ids, apply_skips, property_source, skip_record
from .guards import Checks
from .program_graph import LtcProgramGraph
from .signing import program_secret

if TYPE_CHECKING:
    from ..graph.cache import GraphCache

__all__ = ["FramesProgram", "describe_breaks", "graph_break_reasons", "load_frames",
           "load_program", "pinned_apis", "store_program"]

logger = logging.getLogger("ltc_cache.precompile")



def pinned_apis() -> dict[str, Any]:
    """The private torch 2.13 pieces this module relies on (pinned by
    ``tests/test_frames.py``)."""
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo import bytecode_transformation, package

    return {
        "CompilePackage": package.CompilePackage,
        "load_guard_manager": package.load_guard_manager,
        "cache_entries": _debug_get_cache_entry_list,
        "unique_id_counter": bytecode_transformation._unique_id_counter,
    }


def graph_break_reasons() -> dict[str, int]:
    """Dynamo's graph-break reasons (first line -> count) as they stand: its
    ``unimplemented`` counter (what it could not trace) and ``graph_break``
    (breaks it reports by message)."""
    from torch._dynamo.utils import counters as dynamo_counters

    reasons: dict[str, int] = {}
    for group in ("unimplemented", "graph_break"):
        for reason, count in dynamo_counters[group].items():
            line = (str(reason).strip().splitlines() or ["?"])[0][:200]
            reasons[line] = reasons.get(line, 0) + int(count)
    return reasons


# --- per-frame portable checks -------------------------------------------------


# Why stored frames did not fit, logged once the call is over.
_PENDING: list[str] = []


def _log_pending(name: str) -> None:
    while _PENDING:
        logger.info("%s: a stored frame does not fit this call (%s); Dynamo captures that "
                    "frame again", name, _PENDING.pop(0))


class _FrameGuard:
    """The portable checks of one frame, as a lambda guard of its guard
    manager: resolved against the first call that reaches it (objects
    described as recorded), then the identity checks they compile to."""

    def __init__(self, checks: Sequence[Any], f_globals: dict[str, Any]) -> None:

        self._checks = Checks(checks)
        self._globals = f_globals
        self._failed = False
        # Checks of builtins read them through the dict Dynamo names so.
        import builtins

        for name in self._checks.builtins_dicts:
            f_globals.setdefault(name, builtins.__dict__)

    def __call__(self, f_locals: Mapping[str, Any]) -> bool:
        fast = self._checks.fast
        if fast is not None:
            return fast(f_locals, self._globals)
        if self._failed:
            return False
        try:
            why = self._checks.resolve(f_locals, self._globals)
        except Exception as exc:  # a check that cannot be built: never run the frame
            why = f"{type(exc).__name__}: {first_line(exc)}"
        if why is not None:
            self._failed = True
            # Logged after the call: a guard runs inside the eval-frame hook,
            # which would visit the logger's frames.
            _PENDING.append(why)
            return False
        return True


def _add_checks(guard_manager: Any, checks: Sequence[Any], f_globals: dict[str, Any]) -> None:
    if checks:
        guard_manager.root.add_lambda_guard(_FrameGuard(checks, f_globals),
                                            ["ltc_cache portable checks"], None)


# --- the package ---------------------------------------------------------------


def _package_class() -> type:
    from torch._dynamo.package import CompilePackage

    class _Package(CompilePackage):
        """A CompilePackage that records, for each frame it is given, the
        portable checks its guard filter made, and the sources Dynamo
        traced as code records (not the module texts)."""

        def __init__(self, fn: Any, dynamo: Any = None, guard_filter: Any = None) -> None:
            self.ltc_filter = guard_filter
            self.ltc_frames: list[tuple[types.CodeType, types.CodeType, list[Any]]] = []
            self.ltc_sources: list[Any] = []
            self.ltc_unportable: str | None = None
            self.ltc_left_out: list[str] = []  # frames not in the package (their names)
            self.ltc_installed: dict[str, Any] = {}  # globals Dynamo installed, by name
            self.ltc_skips: list[list[Any]] = []  # codes Dynamo runs as they are
            self.ltc_dynamo_error: BaseException | None = None
            # Every frame compiled here with its checks, stored or not: the
            # filter dropped its identity guards, so its live entry gets
            # the checks in their place (FramesProgram._check_new_frames).
            self.ltc_live: list[tuple[types.CodeType, types.CodeType, list[Any]]] = []
            self.ltc_code: types.CodeType | None = None
            super().__init__(fn, dynamo, ignore_inlined_sources=True)

        def code_context(self, code: types.CodeType) -> Any:
            # Dynamo compiles a frame of its own for user code it does not
            # inline; the package names it by its module and qualname, which
            # fails for some (a property's getter): those are named here, and
            # a frame that cannot be named is left out of the package (a
            # later process captures that frame alone) instead of failing
            # the capture.
            self.ltc_code = code
            if code not in self._codes and not self._located(code):
                return self._left_out(code)
            return super().code_context(code)

        def _located(self, code: types.CodeType) -> bool:
            from torch._dynamo.exc import PackageError

            try:
                self._add_user_function(code)
                return True
            except PackageError:
                pass
            found = property_source(code)
            if found is None:
                return False
            module, function_name, code_source = found
            self._add_function(code, module, function_name=function_name,
                               code_source=code_source)
            return True

        @contextlib.contextmanager
        def _left_out(self, code: types.CodeType) -> Iterator[None]:
            from torch._dynamo.package import SerializedCode, _DynamoCodeCacheEntry

            self.ltc_left_out.append(code.co_qualname)
            if self._current_entry is not None:
                raise AssertionError("_current_entry is already set in code_context")
            # A bypassed entry takes what Dynamo records of the frame and is
            # stored nowhere.
            self._current_entry = _DynamoCodeCacheEntry(
                python_code=SerializedCode.from_code_object(code),
                python_module=getattr(inspect.getmodule(code), "__name__", "?"),
                function_names=[], guarded_codes=[], import_sources={}, backend_ids=[],
                code_source=None, install_to_global=False, bypassed=True)
            try:
                yield
            finally:
                self._current_entry = None

        def add_guarded_code(self, guards_state: bytes, dynamo_code: types.CodeType) -> None:
            entry = self._current_entry
            flt = self.ltc_filter
            checks = list(flt.checks) if flt is not None else []
            if self.ltc_code is not None:
                self.ltc_live.append((self.ltc_code, dynamo_code, checks))
            super().add_guarded_code(guards_state, dynamo_code)
            if entry is None or entry.bypassed:
                return
            code = next(c for c, e in self._codes.items() if e is entry)
            why = self._globals_saved(entry, dynamo_code)
            if why is not None:  # this frame alone is captured again in a later process
                entry.guarded_codes.pop()
                self.ltc_left_out.append(f"{code.co_qualname} ({why})")
                return
            if flt is not None and flt.unportable:
                self.ltc_unportable = self.ltc_unportable or flt.unportable
            self.ltc_frames.append((code, dynamo_code, checks))

        def _globals_saved(self, entry: Any, dynamo_code: types.CodeType) -> str | None:
            """Globals the frame's bytecode reads that Dynamo installed for
            it (a module it reconstructs, a helper) are not in the package:
            modules are added as its imports; anything else leaves the frame
            out (None where all are saved)."""
            for name in _global_names(dynamo_code):
                value = self.ltc_installed.get(name, _MISSING)
                if value is _MISSING or name.startswith(_PACKAGED):
                    continue
                if isinstance(value, types.ModuleType) and \
                        sys.modules.get(value.__name__) is value:
                    entry.import_sources[name] = value.__name__
                    continue
                return f"reads {name}, a {type(value).__name__} Dynamo installed"
            return None

        def add_inlined_source(self, sources: list[types.CodeType]) -> None:
            for code in sources:
                if code in self._resume_codes:
                    continue
                try:
                    record = code_record(code)
                except Unportable as exc:
                    self.ltc_unportable = self.ltc_unportable or str(exc)
                    continue
                if record is not None and record not in self.ltc_sources:
                    self.ltc_sources.append(record)

    return _Package


_MISSING = object()
# Globals CompilePackage saves and installs itself.
_PACKAGED = ("__compiled_fn_", "__resume_at_", "__builtins_dict__")


def _global_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _global_names(const)


@contextlib.contextmanager
def _recording(package: Any) -> Iterator[None]:
    """While a call runs through Dynamo: record each global it installs
    (name -> value), and each code it decides to run as it is from then on
    (the frames the eager parts between graphs call: a logger's, say),
    which a later process is told at load instead of visiting each again."""
    from torch._dynamo.convert_frame import ConvertFrame
    from torch._dynamo.output_graph import OutputGraph

    installed, skips = package.ltc_installed, package.ltc_skips
    install_original, call_original = OutputGraph.install_global_unsafe, ConvertFrame.__call__

    def install_global_unsafe(self: Any, name: str, value: Any) -> None:
        installed[name] = value
        install_original(self, name, value)

    def call(self: Any, frame: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            result = call_original(self, frame, *args, **kwargs)
        except BaseException as exc:
            package.ltc_dynamo_error = exc  # Dynamo's failure, not the user's code's
            raise
        try:
            strategy = result.frame_exec_strategy
            if result.apply_to_code and result.guarded_code is None \
                    and int(strategy.cur_action) == SKIP:
                record = skip_record(frame.f_code, frame.f_globals,
                                      int(strategy.recursive_action))
                if record is not None and record not in skips:
                    skips.append(record)
        except Exception:  # only a record for later processes: never in the way
            logger.debug("ltc_cache: no skip record for a frame", exc_info=True)
        return result

    OutputGraph.install_global_unsafe = install_global_unsafe  # type: ignore[method-assign]
    ConvertFrame.__call__ = call  # type: ignore[method-assign]
    try:
        yield
    finally:
        OutputGraph.install_global_unsafe = install_original  # type: ignore[method-assign]
        ConvertFrame.__call__ = call_original  # type: ignore[method-assign]


class _PlainBackend:
    """The backend as ``torch._dynamo.optimize`` hands it on, without the
    minifier's wrapper (``repro.after_dynamo.WrapBackendDebug``), whose
    module imports AOTAutograd, Inductor's code cache and networkx: seconds
    of a warm start that loads every frame and compiles none."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._torchdynamo_orig_backend = fn
        self.__name__ = str(getattr(fn, "compiler_name", getattr(fn, "__name__", "backend")))

    def __call__(self, gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
        return self._torchdynamo_orig_backend(gm, example_inputs, **kwargs)


@contextlib.contextmanager
def _plain_backend() -> Iterator[None]:
    from torch._dynamo import eval_frame

    original = eval_frame.get_compiler_fn
    eval_frame.get_compiler_fn = _PlainBackend  # type: ignore[assignment]
    try:
        yield
    finally:
        eval_frame.get_compiler_fn = original


class _Backend:
    """What ``CompilePackage.install`` wants of a stored backend."""

    def __init__(self, fn: Any) -> None:
        self._fn = fn

    def after_deserialization(self) -> Any:
        return self._fn


# --- one function's frames ------------------------------------------------------


class FramesProgram:
    """The frames of one function in this process: a package (captured
    here, or loaded and installed), the function compiled through Dynamo
    with that package attached, and what is stored of it."""

    def __init__(self, fn: types.FunctionType, name: str, backend: Callable[..., Any],
                 package: Any, guard_filter: Any, loaded_frames: int = 0) -> None:
        self._fn = fn
        self._name = name
        self.package = package
        self._filter = guard_filter
        # Static shapes, as a single-graph program: a new shape is a
        # recompile of the frames it reaches (and stored under its layout).
        with _plain_backend():
            self._compiled = torch._dynamo.optimize(backend, package=package, dynamic=False,
                                                    guard_filter_fn=guard_filter)(fn)
        self._stored_frames = loaded_frames  # frames in the stored artifact
        self.breaks: dict[str, int] = {}  # Dynamo's graph-break reasons, captured here
        self.unsaveable: str | None = None

    @classmethod
    def fresh(cls, fn: types.FunctionType, name: str, backend: Callable[..., Any],
              guard_filter: Any) -> FramesProgram:
        package = _package_class()(fn, None, guard_filter)
        return cls(fn, name, backend, package, guard_filter)

    def frame_count(self) -> int:
        return len(self.package.ltc_frames)

    def check(self, f_locals: Mapping[str, Any]) -> bool:
        return True  # each frame's guards are Dynamo's (and ours) on the way

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        return {}

    def run(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """The call, through Dynamo; raises what it raises (where Dynamo
        itself failed, ``dynamo_failed()`` says so)."""
        self.package.ltc_dynamo_error = None
        before, reasons = len(self.package.ltc_frames), graph_break_reasons()
        live = len(self.package.ltc_live)
        # Inside DistributedDataParallel's forward, Dynamo hands each frame
        # to its DDPOptimizer through a callback of its own, without the
        # package (nothing would be recorded): each frame is one graph here,
        # as in a single-graph program, and DDP's own hooks reduce the
        # gradients as backward makes them.
        try:
            with _recording(self.package), torch._dynamo.config.patch(optimize_ddp=False):
                out = self._compiled(*args, **kwargs)
        finally:
            _log_pending(self._name)
        if len(self.package.ltc_live) != live:
            self._check_new_frames(live)
        if len(self.package.ltc_frames) != before:
            for reason, count in graph_break_reasons().items():
                if count > reasons.get(reason, 0):
                    self.breaks[reason] = self.breaks.get(reason, 0) + count - \
                        reasons.get(reason, 0)
        return out

    def dynamo_failed(self) -> BaseException | None:
        """What Dynamo raised converting a frame in the last call, if it did."""
        return self.package.ltc_dynamo_error

    def _check_new_frames(self, before: int) -> None:
        """Frames captured by the call just made carry their portable checks
        from now on, in this process too."""
        from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

        for code, dynamo_code, checks in self.package.ltc_live[before:]:
            if not checks:
                continue
            module = inspect.getmodule(code)
            scope = module.__dict__ if module is not None else {}
            for entry in _debug_get_cache_entry_list(code):
                if entry.code is dynamo_code:
                    _add_checks(entry.guard_manager, checks, scope)

    def needs_store(self) -> bool:
        return self.frame_count() > self._stored_frames and self.unsaveable is None

    def artifact(self) -> tuple[bytes, list[Any], dict[str, Any]]:
        """The stored form: the pickled package state with every frame's
        graph, the per-frame checks ``[code index, guarded index, checks]``,
        and a description of each code (for ``ltc-cache show``). Raises
        Unportable."""

        package = self.package
        if package.ltc_unportable:
            raise Unportable(package.ltc_unportable)
        entry = package.cache_entry()
        if any(code.bypassed for code in entry.codes):
            raise Unportable("Dynamo bypassed a frame of the package")
        backends = {}
        for backend_id in entry.backend_ids:
            graph = package.cached_backends.get(backend_id)
            if not isinstance(graph, LtcProgramGraph):
                raise Unportable(f"frame graph {backend_id} is a {type(graph).__name__}, "
                                 "not the ltc_cache backend's")
            backends[backend_id] = LtcProgramGraph.serialize_compile_artifacts(graph)
        codes = list(package._codes)
        position = {code: i for i, code in enumerate(codes)}
        counts: dict[int, int] = {}
        checks = []
        for code, _, frame_checks in package.ltc_frames:
            i = position[code]
            j = counts.get(i, 0)
            counts[i] = j + 1
            if frame_checks:
                checks.append([i, j, frame_checks])
        frames = {"codes": [[c.co_qualname, c.co_filename, c.co_firstlineno,
                             len(package._codes[c].guarded_codes)] for c in codes],
                  "breaks": [[reason, count] for reason, count in self.breaks.items()],
                  "skips": list(package.ltc_skips)}
        state = pickle.dumps({"dynamo": entry, "backends": backends})
        self._stored_frames = self.frame_count()
        return state, checks, frames


def load_frames(fn: types.FunctionType, name: str, backend: Callable[..., Any],
                guard_filter: Any, artifact: bytes, checks: Sequence[Any],
                breaks: Sequence[Any] = (), skips: Sequence[Any] = ()) -> FramesProgram:
    """A stored package installed for ``fn`` (its signature and sources
    checked already by the caller); raises on anything that does not load."""

    # Only ever reached from a program entry whose signature held.
    state = pickle.loads(artifact)
    dynamo, blobs = state["dynamo"], state["backends"]
    package = _package_class()(fn, dynamo, guard_filter)
    backends = {key: _Backend(LtcProgramGraph.deserialize_compile_artifacts(blob))
                for key, blob in blobs.items()}
    by_frame: dict[tuple[int, int], list[Any]] = {}
    for item in checks:
        i, j, frame_checks = item
        by_frame[(int(i), int(j))] = list(frame_checks)
    codes = list(package._codes)
    try:
        _install(package, backends, by_frame, codes)
    except BaseException:
        package.uninstall()  # no half-installed frames left behind
        raise
    # Every module the package installed names in.
    for module in {sys.modules[fn.__module__], *package._installed_globals}:
        advance_unique_ids(module.__dict__)
    apply_skips(skips)
    package.ltc_skips = [list(record) for record in skips]
    frames = sum(len(e.guarded_codes) for e in package._codes.values())
    # What was stored is what this package holds: frames added here (a
    # recompile) are stored again.
    package.ltc_frames = [(code, None, by_frame.get((i, j), []))
                          for i, code in enumerate(codes)
                          for j in range(len(package._codes[code].guarded_codes))]
    program = FramesProgram(fn, name, backend, package, guard_filter, loaded_frames=frames)
    program.breaks = {str(reason): int(count) for reason, count in breaks}
    return program


def describe_breaks(breaks: Mapping[str, int]) -> str:
    """Dynamo's graph-break reasons in one line (for the log)."""
    if not breaks:
        return "no graph break reason recorded"
    return "; ".join(reason + (f" (x{count})" if count > 1 else "")
                     for reason, count in breaks.items())


def _install(package: Any, backends: Mapping[str, Any],
             checks: Mapping[tuple[int, int], list[Any]],
             codes: Sequence[types.CodeType]) -> None:
    """``package.install(backends)``, with each frame's guard manager given
    its portable checks: install builds them code by code, guarded code by
    guarded code, in the package's order, which is the order they were
    recorded in."""
    from torch._dynamo import package as torch_package

    original = torch_package.load_guard_manager
    order = [(i, j) for i, code in enumerate(codes)
             for j in range(len(package._codes[code].guarded_codes))]
    built = iter(order)

    def load_guard_manager(state: Any, target_code: types.CodeType, scope: Any) -> Any:
        manager = original(state, target_code, scope)
        _add_checks(manager, checks.get(next(built), []), scope)
        return manager

    torch_package.load_guard_manager = load_guard_manager
    try:
        package.install(dict(backends))
    finally:
        torch_package.load_guard_manager = original


# --- as cache entries ----------------------------------------------------------


def load_program(fn: types.FunctionType, name: str, backend: Callable[..., Any],
                 guard_filter: Any, parts: ProgramParts, key: CacheKey) -> FramesProgram | None:
    """The frames of a program entry whose signature and sources held,
    installed; None (logged) where they do not load."""
    described = parts.frames or {}
    try:
        program = load_frames(fn, name, backend, guard_filter, parts.artifact, parts.checks,
                              described.get("breaks") or (), described.get("skips") or ())
    except Exception as exc:
        logger.info("%s: program %s does not load (%s: %s); capturing again", name,
                    key.digest[:12], type(exc).__name__, first_line(exc))
        return None
    logger.info("%s: loaded program %s of %d frames (graph breaks: %s)", name,
                key.digest[:12], program.frame_count(), describe_breaks(program.breaks))
    return program


def store_program(frames: FramesProgram, key: CacheKey, local_only: bool, cache: GraphCache,
                  name: str, first: bool) -> None:
    """Store the frames as a signed program entry under ``key``; where they
    cannot be saved, say so (``first``: at INFO, else at DEBUG) and keep
    them in this process only."""

    level = logging.INFO if first else logging.DEBUG
    try:
        secret = program_secret(cache.config.secret, cache.config.directory)
        artifact, checks, described = frames.artifact()
    except Exception as exc:
        why = str(exc) if isinstance(exc, Unportable) else \
            f"{type(exc).__name__}: {first_line(exc)}"
        frames.unsaveable = why
        logger.log(level, "%s: compiled as %d frames (graph breaks: %s); its program cannot "
                   "be saved (%s): Dynamo captures it in every process", name,
                   frames.frame_count(), describe_breaks(frames.breaks), why)
        return
    sources = list(frames.package.ltc_sources)
    nodes = sum(len(g.gm.graph.nodes) for g in frames.package.cached_backends.values()
                if isinstance(g, LtcProgramGraph))
    entry = program_entry(key, f"{name}.program", sources=sources, checks=checks,
                          globals_=[], artifact=artifact, secret=secret, node_count=nodes,
                          frames=described)
    cache.store_entry(entry, key, local_only=local_only)
    logger.log(level, "%s: compiled as %d frames (graph breaks: %s); stored program %s "
               "(%d sources, %d frames with portable checks)", name, frames.frame_count(),
               describe_breaks(frames.breaks), key.digest[:12], len(sources), len(checks))
