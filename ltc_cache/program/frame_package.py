"""The torch 2.13 ``CompilePackage`` mechanics under a program of frames
(:mod:`.frames`): a package that records each frame's portable checks and
sources, the globals Dynamo installs and the frames it leaves to run as they
are, the backend handed to ``torch._dynamo.optimize`` without the minifier's
wrapper, and installing a loaded package with each frame's checks added to
its guard manager. Every private torch piece used here is in
:func:`pinned_apis`, pinned by a test."""

from __future__ import annotations

import builtins
import contextlib
import inspect
import logging
import sys
import threading
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

# Private to torch, and pinned (pinned_apis). Imported here, not where it is
# used, for FramePackage to subclass: this module's one importer, frames.py,
# imports torch._dynamo (which imports this module) anyway, and
# ``import ltc_cache`` imports neither.
from torch._dynamo.package import CompilePackage

from ..errors import Unportable, first_line
from ..threads import SharedPatch
from .describe import code_record
from .frame_names import SKIP, property_source, skip_record
from .guards import Checks

logger = logging.getLogger("ltc_cache.precompile")


def pinned_apis() -> dict[str, Any]:
    """The private torch 2.13 pieces this module relies on (pinned by
    ``tests/program/test_frames.py``)."""
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo import bytecode_transformation, package

    return {
        "CompilePackage": package.CompilePackage,
        "load_guard_manager": package.load_guard_manager,
        "cache_entries": _debug_get_cache_entry_list,
        "unique_id_counter": bytecode_transformation._unique_id_counter,
    }


# Why stored frames did not fit, logged once the call is over.
PENDING_MISFITS: list[str] = []


def log_misfits(name: str) -> None:
    while PENDING_MISFITS:
        logger.info("%s: a stored frame does not fit this call (%s); Dynamo captures that "
                    "frame again", name, PENDING_MISFITS.pop(0))


class FrameGuard:
    """The portable checks of one frame, as a lambda guard of its guard
    manager: resolved against the first call that reaches it (objects
    described as recorded), then the identity checks they compile to."""

    def __init__(self, checks: Sequence[Any], f_globals: dict[str, Any]) -> None:

        self._checks = Checks(checks)
        self._globals = f_globals
        self._failed = False
        self._resolving = threading.Lock()  # resolved once, whatever the threads
        # Checks of builtins read them through the dict Dynamo names so.

        for name in self._checks.builtins_dicts:
            f_globals.setdefault(name, builtins.__dict__)

    def __call__(self, f_locals: Mapping[str, Any]) -> bool:
        fast = self._checks.fast
        if fast is not None:
            return fast(f_locals, self._globals)
        with self._resolving:
            return self._resolve(f_locals)

    def _resolve(self, f_locals: Mapping[str, Any]) -> bool:
        fast = self._checks.fast  # another thread's call may have resolved them
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
            PENDING_MISFITS.append(why)
            return False
        return True


def add_checks(guard_manager: Any, checks: Sequence[Any], f_globals: dict[str, Any]) -> None:
    if checks:
        guard_manager.root.add_lambda_guard(FrameGuard(checks, f_globals),
                                            ["ltc_cache portable checks"], None)


class FramePackage(CompilePackage):
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


_MISSING = object()


# Globals CompilePackage saves and installs itself.
_PACKAGED = ("__compiled_fn_", "__resume_at_", "__builtins_dict__")


def _global_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _global_names(const)


class CallRecord:
    """What Dynamo did for one call of a program of frames, in the thread
    making it: the frames it captured (``(code, Dynamo's code, checks)``,
    as the package's ``ltc_live``), the graph-break reasons of the captures
    that added frames to the package, and what Dynamo raised converting a
    frame (its failure, not the user's code's)."""

    __slots__ = ("breaks", "error", "live", "package")

    def __init__(self, package: Any) -> None:
        self.package = package
        self.live: list[tuple[types.CodeType, types.CodeType, list[Any]]] = []
        self.breaks: dict[str, int] = {}
        self.error: BaseException | None = None


# The record of the call this thread is making through a package, if any.
_calls = threading.local()


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


def _install_recorders() -> Callable[[], None]:
    """Hook Dynamo where a call through a package is recorded (the globals
    Dynamo installs, each frame it converts); returns what unhooks it. A
    hook records into the calling thread's :class:`CallRecord`, and does
    nothing more in a thread making no such call."""
    from torch._dynamo.convert_frame import ConvertFrame
    from torch._dynamo.output_graph import OutputGraph

    install_original, call_original = OutputGraph.install_global_unsafe, ConvertFrame.__call__

    def install_global_unsafe(self: Any, name: str, value: Any) -> None:
        record = getattr(_calls, "record", None)
        if record is not None:
            record.package.ltc_installed[name] = value
        install_original(self, name, value)

    def call(self: Any, frame: Any, *args: Any, **kwargs: Any) -> Any:
        record = getattr(_calls, "record", None)
        if record is None:
            return call_original(self, frame, *args, **kwargs)
        return _converting(record, lambda: call_original(self, frame, *args, **kwargs), frame)

    OutputGraph.install_global_unsafe = install_global_unsafe  # type: ignore[method-assign]
    ConvertFrame.__call__ = call  # type: ignore[method-assign]

    def uninstall() -> None:
        OutputGraph.install_global_unsafe = install_original  # type: ignore[method-assign]
        ConvertFrame.__call__ = call_original  # type: ignore[method-assign]

    return uninstall


# In place while any thread makes a call through a package.
_RECORDERS = SharedPatch(_install_recorders)


def _converting(record: CallRecord, convert: Callable[[], Any], frame: Any) -> Any:
    """Dynamo converting one frame of a recorded call (``convert()``). It
    runs under Dynamo's compile lock, so what the package gains meanwhile
    is this conversion's."""
    package = record.package
    live, frames, reasons = len(package.ltc_live), len(package.ltc_frames), \
        graph_break_reasons()
    try:
        result = convert()
    except BaseException as exc:
        record.error = exc  # Dynamo's failure, not the user's code's
        raise
    record.live.extend(package.ltc_live[live:])
    if len(package.ltc_frames) != frames:
        for reason, count in graph_break_reasons().items():
            if count > reasons.get(reason, 0):
                record.breaks[reason] = record.breaks.get(reason, 0) + count - \
                    reasons.get(reason, 0)
    try:
        strategy = result.frame_exec_strategy
        if result.apply_to_code and result.guarded_code is None \
                and int(strategy.cur_action) == SKIP:
            skip = skip_record(frame.f_code, frame.f_globals, int(strategy.recursive_action))
            if skip is not None and skip not in package.ltc_skips:
                package.ltc_skips.append(skip)
    except Exception:  # only a record for later processes: never in the way
        logger.debug("ltc_cache: no skip record for a frame", exc_info=True)
    return result


@contextlib.contextmanager
def recording(package: Any) -> Iterator[CallRecord]:
    """While a call runs through Dynamo: record each global it installs
    (name -> value), and each code it decides to run as it is from then on
    (the frames the eager parts between graphs call: a logger's, say),
    which a later process is told at load instead of visiting each again;
    and what the call's own conversions did (the :class:`CallRecord` given).
    Calls on several threads at once each get their own record; the hooks
    stay in place until the last of them ends (ltc_cache/threads.py)."""
    record = CallRecord(package)
    outer = getattr(_calls, "record", None)
    _calls.record = record
    try:
        with _RECORDERS.held():
            yield record
    finally:
        _calls.record = outer


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
def plain_backend() -> Iterator[None]:
    from torch._dynamo import eval_frame

    original = eval_frame.get_compiler_fn
    eval_frame.get_compiler_fn = _PlainBackend  # type: ignore[assignment]
    try:
        yield
    finally:
        eval_frame.get_compiler_fn = original


class StoredBackend:
    """What ``CompilePackage.install`` wants of a stored backend."""

    def __init__(self, fn: Any) -> None:
        self._fn = fn

    def after_deserialization(self) -> Any:
        return self._fn


def install_package(package: Any, backends: Mapping[str, Any],
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
        add_checks(manager, checks.get(next(built), []), scope)
        return manager

    torch_package.load_guard_manager = load_guard_manager
    try:
        package.install(dict(backends))
    finally:
        torch_package.load_guard_manager = original
