"""``ltc_cache.compile``: ``torch.compile(model, backend="ltc_cache")`` whose
warm start skips Dynamo too.

The first call with a new input layout looks up a **program** for it
(:mod:`ltc_cache.program`): what Dynamo's AOT precompile
(``torch.compile(fn, fullgraph=True).aot_compile``) made of the function, its
transformed bytecode, its guards, and the FX graph the ltc_cache backend
compiles. A hit loads it with no capture and no trace: the graph goes
through the backend on the first call, where its LTC graphs (and, for
inference, its partitioning plan) are cache hits. A miss captures, stores
the program, and runs what a later process would load.

What keeps a program from being stale or wrong:

- its key: the torch and Python versions, grad mode, the input layouts, the
  compiled function, and the module's structure (classes, train/eval flags,
  tensor layouts);
- the source of every function Dynamo inlined, recorded at capture and
  compared on load (Dynamo records checksums but never compares them);
- Dynamo's guards, checked on every call; those Dynamo cannot save (object
  identities) are replaced by checks of what the object is (a class,
  function, module by name and code), on load and on every call;
- a signature (HMAC-SHA256, a key outside the cache directory) checked
  before the artifact, a pickle, is unpickled.

A changed source, a failing guard or a program that does not load is
captured again (and stored again). A function Dynamo cannot capture whole
(a graph break) is compiled as several frames and stored as a program of
frames (:mod:`ltc_cache.frames`); one whose program cannot be saved runs
through ``torch.compile(backend="ltc_cache")`` as before, with one INFO line.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import logging
import re
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch._dynamo.aot_compile_types import SerializableCallable

from .cache import GraphCache, default_cache
from .check_exprs import checks_code, without_dict_copies
from .compiled_module import CompiledModule, stand_in
from .diagnostics import counters, warn_once
from .errors import EntryError, UncacheableGraph, first_line
from .frames import FramesProgram, load_program, store_program
from .keys import CacheKey
from .program import (
    OBJECT_DEPTH,
    ProgramParts,
    Unportable,
    changed_source,
    code_record,
    describe,
    names_process_specific,
    negative_program_entry,
    plain_object,
    portable_check,
    portable_expression,
    program_entry,
    program_key,
    program_parts,
    program_secret,
)

__all__ = ["PROGRAM_CAPTURES", "PROGRAM_FALLBACKS", "PROGRAM_HITS", "PROGRAM_LOOKUPS",
           "CompiledModule", "compile"]

logger = logging.getLogger("ltc_cache.precompile")

# Per-process counters (``ltc_cache.stats()``).
PROGRAM_HITS = "program_hits"  # programs loaded from the cache
PROGRAM_CAPTURES = "program_captures"  # programs captured (and stored)
PROGRAM_FALLBACKS = "program_fallbacks"  # calls routed to torch.compile
PROGRAM_LOOKUPS = "program_lookups"  # program (or negative program) entries found

# torch.compile's arguments besides the backend.
_COMPILE_KWARGS = frozenset({"fullgraph", "dynamic", "mode", "options", "disable"})
# Programs kept per input layout before the layout goes to torch.compile
# (Dynamo's recompile limit plays this part there).
_MAX_PROGRAMS = 8
_BUILTINS_DICT = re.compile(r"G\['(__builtins_dict___\d+)'\]")
_UNSERIALIZABLE = ("DICT_VERSION", "NN_MODULE", "ID_MATCH", "FUNCTION_MATCH", "CLASS_MATCH",
                   "MODULE_MATCH", "CLOSURE_MATCH", "WEAKREF_ALIVE")


# --- the backend's serializable callable ---------------------------------------


class LtcProgramGraph(SerializableCallable):
    """The Dynamo graph of a program, compiled by the ltc_cache backend on
    its first call (real tensors, outside Dynamo): its LTC graphs and plan
    are cache entries of their own, so on a warm start this is lookups and
    parses, no trace. Serialised as the graph itself (torch's graph
    pickler), with what AOTAutograd reads beside it that the pickler drops
    (each placeholder's ``_dynamo_source``)."""

    def __init__(self, gm: torch.fx.GraphModule, name: str) -> None:
        self.gm = gm
        self.name = name
        self._call: Callable[..., Any] | None = None

    @classmethod
    def serialize_compile_artifacts(cls, fn: LtcProgramGraph) -> bytes:
        import pickle

        from torch.fx._graph_pickler import GraphPickler, Options

        gm = fn.gm
        for node in gm.graph.nodes:  # not picklable, and not read by the backend
            for name in ("nn_module_stack", "source_fn_stack", "example_value"):
                node.meta.pop(name, None)
        sources = [getattr(n, "_dynamo_source", None)
                   for n in gm.graph.find_nodes(op="placeholder")]
        return pickle.dumps({
            "graph": GraphPickler.dumps(gm, Options(ops_filter=None)),
            "sources": sources,
            "param_name_to_source": getattr(gm, "_param_name_to_source", None),
            "name": fn.name,
        })

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> LtcProgramGraph:
        import pickle

        from torch._subclasses import FakeTensorMode
        from torch.fx._graph_pickler import GraphPickler
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        # Only ever reached from a program entry whose signature held.
        state = pickle.loads(data)
        gm = GraphPickler.loads(state["graph"], FakeTensorMode(shape_env=ShapeEnv()))
        placeholders = list(gm.graph.find_nodes(op="placeholder"))
        if len(placeholders) != len(state["sources"]):
            raise EntryError("program: placeholder sources do not fit the graph")
        for node, source in zip(placeholders, state["sources"], strict=True):
            node._dynamo_source = source
        if state["param_name_to_source"] is not None:
            gm._param_name_to_source = state["param_name_to_source"]
        # (The pickler's GraphModule has recompiled its code already: the
        # same code, so the same LTC cache keys; pinned by a test.)
        return cls(gm, str(state["name"]))

    def __call__(self, *args: Any) -> Any:
        call = self._call
        if call is None:
            call = self._call = self._compile(args)
        return call(*args)

    def _compile(self, args: Sequence[Any]) -> Callable[..., Any]:
        from .dynamo import LtcBackend, run_time_tracing

        # Real inputs, as Dynamo gives them, and its tracing context.
        with run_time_tracing():
            return LtcBackend(name=self.name)(self.gm, list(args))


def _backend(name: str) -> Callable[..., LtcProgramGraph]:
    def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> LtcProgramGraph:
        # Compiled on the first call, not here: aot_compile runs backends
        # under AOTAutograd-cache settings the ltc_cache backend's own
        # AOTAutograd path fails under.
        return LtcProgramGraph(gm, name)

    backend.compiler_name = "ltc_cache"  # type: ignore[attr-defined]
    return backend


# --- guards --------------------------------------------------------------------


def _guard_closure_vars() -> dict[str, Any]:
    from torch._dynamo.guards import _get_closure_vars

    return dict(_get_closure_vars())


def _global_root(source: Any) -> str | None:
    from torch._dynamo.source import get_global_source_name

    return get_global_source_name(source)


class _GuardFilter:
    """The ``guard_filter_fn`` of a capture. Keeps every guard Dynamo can
    save; each one it cannot (an object identity), and each guard reached
    through such an object, becomes a portable check instead
    (:func:`ltc_cache.program.portable_check`). A guard that can be neither
    makes the program unportable (it is not stored)."""

    def __init__(self, fn_globals: Mapping[str, Any]) -> None:
        self.checks: list[list[Any]] = []
        self.globals: list[str] = []
        self.unportable: str | None = None
        # Where Dynamo installs the globals it names after object ids.
        self._fn_globals = fn_globals

    def __call__(self, entries: Sequence[Any]) -> list[bool]:
        self.checks, self.unportable = [], None
        # A guard through a global named after an object id would never hold
        # in another process, saved or not: a portable check stands in for it.
        dropped = {e.orig_guard.name for e in entries
                   if self._unserializable(e) or names_process_specific(e.orig_guard.name)}
        # Guards reached through a function Dynamo cannot save (its closure,
        # its defaults) do not load without it: checked here too. Through a
        # module or class they load (those are saved by name) and stay.
        functions = {e.orig_guard.name for e in entries
                     if e.guard_type in ("CLOSURE_MATCH", "FUNCTION_MATCH")}
        keep, direct = [], set()
        for e in entries:
            guard = e.orig_guard
            if guard.name not in dropped and not self._beneath(guard.originating_source,
                                                               functions):
                keep.append(True)
                # Where the guard came from (for messages only) is formatted
                # for every guard as it is built; on load that was a fifth
                # of the time for a 128-layer model.
                guard.stack = guard.user_stack = None
                root = _global_root(guard.originating_source)
                if root and not root.startswith(("__import_", "__builtins_dict__")):
                    direct.add(root)
                continue
            if e.guard_type == "HASATTR" and guard.name in dropped:
                # The check that stands in for the other guard of this name
                # reads the attribute: it fails where the attribute is gone.
                keep.append(False)
                continue
            try:
                expr = portable_expression(guard.name, self._fn_globals)
                if e.guard_type == "DUPLICATE_INPUT" and expr != guard.name:
                    # "this is that" where this is a module's attribute
                    # reached through the module's name: the other source's
                    # own guards say what it is.
                    keep.append(False)
                    continue
                self.checks.append(portable_check(expr, e.guard_type,
                                                  tuple(e.derived_guard_types), e.has_value,
                                                  e.value))
                keep.append(False)
            except Unportable as exc:
                self.unportable = self.unportable or str(exc)
                keep.append(True)  # saving it then fails: no program is stored
        self.globals = sorted(direct)
        return keep

    @staticmethod
    def _unserializable(e: Any) -> bool:
        return (e.guard_type in _UNSERIALIZABLE
                or any(t in _UNSERIALIZABLE for t in e.derived_guard_types)
                or bool(getattr(e.orig_guard, "_unserializable", False)))

    @staticmethod
    def _beneath(source: Any, dropped: set[str]) -> bool:
        base = getattr(source, "base", None)
        while base is not None:
            if base.name in dropped:
                return True
            base = getattr(base, "base", None)
        return False


class _Checks:
    """Portable checks, resolved against the first call (each object
    described as recorded), then one generated function that compares
    identities and values on every call."""

    def __init__(self, checks: Sequence[Any]) -> None:
        parsed = []
        for check in checks:
            try:
                expr, kind, expected = check
            except (TypeError, ValueError):
                raise EntryError(f"program: malformed check {check!r:.80}") from None
            # One expression a line (they are compiled together, once).
            if not isinstance(expr, str) or "\n" in expr or "\r" in expr:
                raise EntryError(f"program: malformed check {check!r:.80}")
            if kind not in ("same", "eq", "type", "len"):
                raise EntryError(f"program: unknown check kind {kind!r}")
            parsed.append((expr, kind, expected))
        self._checks = parsed
        self.builtins_dicts = {m.group(1) for expr, _, _ in parsed
                               for m in _BUILTINS_DICT.finditer(expr)}
        self.fast: Callable[[Mapping[str, Any], Mapping[str, Any]], bool] | None = None

    def resolve(self, f_locals: Mapping[str, Any], f_globals: Mapping[str, Any]) -> str | None:
        """Compare every check on this call; None where all hold (and the
        per-call function is built), else the first that does not."""
        closure = _guard_closure_vars()
        # Every value in one compiled function (one compile, not one a check).
        getters = "".join(f"    try:\n        _out.append(({expr},))\n"
                          f"    except Exception as _e:\n        _out.append(_e)\n"
                          for expr, _, _ in self._checks)
        namespace = {**closure, "__builtins__": builtins}
        exec(checks_code(f"def _values(L, G):\n    _out = []\n{getters}    return _out\n"),
             namespace)
        values = namespace["_values"](f_locals, f_globals)
        objects, lines = [], []
        for (expr, kind, expected), got in zip(self._checks, values, strict=True):
            try:
                if isinstance(got, Exception):
                    raise got
                (value,) = got
                if kind == "len":
                    ok = len(value) == expected
                else:
                    ok = describe(type(value) if kind == "type" else value) == expected
            except Exception as exc:
                return f"{expr}: {type(exc).__name__}: {first_line(exc)}"
            if not ok:
                return f"{expr} is not what the program was made with"
            expr = without_dict_copies(expr)  # the same value, read without copying
            if kind == "same":
                objects.append(value)
                lines.append(f"if ({expr}) is not _o[{len(objects) - 1}]: return False")
            elif kind == "type":
                objects.append(type(value))
                lines.append(f"if type({expr}) is not _o[{len(objects) - 1}]: return False")
            elif kind == "eq":
                objects.append(value)
                lines.append(f"_v = ({expr})")
                lines.append(f"if type(_v) is not type(_o[{len(objects) - 1}]) "
                             f"or _v != _o[{len(objects) - 1}]: return False")
            else:
                lines.append(f"if len({expr}) != {int(expected)}: return False")
        body = "\n".join(f"        {line}" for line in lines) or "        pass"
        source = ("def _check(L, G):\n    try:\n" + body +
                  "\n    except Exception:\n        return False\n    return True\n")
        namespace = {**closure, "__builtins__": builtins, "_o": objects}
        exec(checks_code(source), namespace)
        self.fast = namespace["_check"]
        return None


@contextlib.contextmanager
def _recording_traced_code(codes: list[types.CodeType]) -> Iterator[None]:
    """Collect the code objects Dynamo traced. aot_compile hands each to
    ``SourceInfo.add_code``, which reads the whole module's source into the
    artifact and skips code without a module; this records every one and
    stores nothing (the sources are recorded by :func:`code_record`)."""
    from torch._dynamo.package import SourceInfo

    original = SourceInfo.add_code

    def add_code(self: Any, code: types.CodeType) -> None:
        codes.append(code)

    SourceInfo.add_code = add_code  # type: ignore[method-assign]
    try:
        yield
    finally:
        SourceInfo.add_code = original  # type: ignore[method-assign]


def _once_logging() -> Any:
    """Dynamo's setting that makes it skip, while it captures a program,
    the logger methods that log a message once per process (transformers
    adds ``warning_once`` and ``info_once`` to ``logging.Logger``, and its
    models call them in ``forward``: a ``loss_type`` it does not know, a
    deprecated argument). Dynamo cannot trace a log call; each would be a
    graph break, keeping the model off programs for a message printed once.
    Inside a program they log nothing, in every process."""
    once = {value for name, value in vars(logging.Logger).items()
            if name.endswith("_once") and callable(value)}
    config = torch._dynamo.config
    return config.patch(ignore_logging_functions=set(config.ignore_logging_functions) | once)


# Torch's own constants, one object each for the whole process.
_SHARED_CONSTANTS = (torch.dtype, torch.layout, torch.memory_format)


@contextlib.contextmanager
def _shared_constants_saved() -> Iterator[None]:
    """Dynamo saves a module in the guards' state without the attributes
    no guard reads, marking each such value "missing" by identity; a module
    attribute holding one of torch's shared constants (LightningModule's
    ``_dtype`` is ``torch.float32``) then makes every use of that constant
    in the state missing, tensors' dtypes included, and the program fails
    to load (``empty_strided(): argument 'dtype' must be torch.dtype, not
    _Missing``). Those constants are kept: they pickle by name."""
    from torch._dynamo.guards import GuardsStatePickler

    original = GuardsStatePickler.reducer_override

    def reducer_override(self: Any, obj: Any) -> Any:
        result = original(self, obj)
        if isinstance(obj, torch.nn.Module):
            for key in [k for k, v in self.missing_values.items()
                        if isinstance(v, _SHARED_CONSTANTS)]:
                del self.missing_values[key]
        return result

    GuardsStatePickler.reducer_override = reducer_override  # type: ignore[method-assign]
    try:
        yield
    finally:
        GuardsStatePickler.reducer_override = original  # type: ignore[method-assign]


# --- one loaded program --------------------------------------------------------


class _Loaded:
    """A program ready to run: its guards, the checks standing in for the
    ones Dynamo cannot save, and the transformed bytecode."""

    __slots__ = ("_checks", "_direct", "_fn", "_guards", "_live", "_snapshot", "artifact")

    def __init__(self, artifact: Any, checks: _Checks, live_globals: dict[str, Any],
                 direct_globals: Sequence[str]) -> None:
        self.artifact = artifact
        self._fn = artifact.fn
        self._guards = artifact._artifacts.guard_manager
        self._checks = checks
        self._live = live_globals
        # The bytecode and its guards read a copy of the module's globals
        # made at load; the ones the guards read are refreshed from the
        # module before each check, so rebinding one is seen.
        self._snapshot = artifact.fn.__globals__
        self._direct = tuple(name for name in direct_globals if name in live_globals)
        # Checks of builtins read them through the dict Dynamo names so.
        for name in checks.builtins_dicts:
            self._snapshot.setdefault(name, builtins.__dict__)

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        return self.artifact.prepare_f_locals(*args, **kwargs)

    def _refresh(self) -> None:
        live, snapshot = self._live, self._snapshot
        for name in self._direct:
            if name in live:
                snapshot[name] = live[name]
            else:
                snapshot.pop(name, None)

    def resolve(self, f_locals: Mapping[str, Any]) -> str | None:
        """Why this program does not fit this call, or None."""
        self._refresh()
        if not self._guards.check(f_locals):
            failed = getattr(self._guards.check_verbose(f_locals), "verbose_code_parts", ())
            return f"a guard fails ({'; '.join(str(p) for p in list(failed)[:2])[:300]})"
        return self._checks.resolve(f_locals, self._snapshot)

    def check(self, f_locals: Mapping[str, Any]) -> bool:
        if self._direct:
            self._refresh()
        fast = self._checks.fast
        return fast is not None and self._guards.check(f_locals) and fast(f_locals, self._snapshot)

    def run(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        return self._fn(*args, **kwargs)


# --- the programs of one function ---------------------------------------------


def _layout(value: Any, depth: int = 0) -> Any:
    """A cheap, hashable picture of an argument, to pick the programs to try."""
    if depth > OBJECT_DEPTH:  # (a cycle): the program key refuses it
        return (type(value), id(value))
    if isinstance(value, torch.Tensor):
        return (value.shape, value.dtype, value.device, value.requires_grad)
    if value is None or isinstance(value, bool | int | float | str):
        return (type(value), value)
    if isinstance(value, torch.dtype | torch.device | torch.memory_format | torch.layout):
        return (type(value), str(value))  # equal ones need not be the same object
    if isinstance(value, tuple | list):
        return (type(value), tuple(_layout(v, depth + 1) for v in value))
    if isinstance(value, dict):
        return (type(value), tuple((k, _layout(v, depth + 1)) for k, v in value.items()))
    if getattr(value, "is_compileable", True) is False:
        # transformers' DynamicCache: a new layout every decoding step.
        raise _Growing(type(value).__name__)
    if plain_object(value):  # a StaticCache: the same layout every step
        return (type(value), tuple((k, _layout(v, depth + 1)) for k, v in vars(value).items()))
    return (type(value), id(value))


class _Growing(Exception):
    """An argument whose layout changes on every call (a dynamic key/value
    cache): a program per call would be a capture per decoding step."""


class _Programs:
    """The programs of one function (``fn``, called with ``owner`` first
    where it is a module's forward), one or more per input layout."""

    def __init__(self, fn: types.FunctionType, owner: Any, name: str,
                 compile_kwargs: Mapping[str, Any], fallback_target: Any,
                 cache: GraphCache | None = None) -> None:
        self._fn = fn
        self._owner = owner
        self._name = name
        self._kwargs = dict(compile_kwargs)
        self._fallback_target = fallback_target
        self._fallback: Callable[..., Any] | None = None
        self._cache = cache
        self._by_layout: dict[Any, list[_Loaded]] = {}
        self._to_fallback: set[Any] = set()
        self._growing = False
        self._closure = {f"ltc_cache.closure.{i}": cell.cell_contents
                         for i, cell in enumerate(fn.__closure__ or ())}
        # The function's frames where Dynamo compiles it as several (graph
        # breaks): one package a process, which each layout's program adds to.
        self._frames: FramesProgram | None = None
        self._frames_keys: dict[Any, tuple[CacheKey, bool]] = {}
        self._frames_logged = False

    @property
    def cache(self) -> GraphCache:
        return self._cache if self._cache is not None else default_cache()

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            layout = (torch.is_grad_enabled(), _layout(args), _layout(kwargs))
        except _Growing as exc:
            if not self._growing:
                self._growing = True
                logger.info("%s: called with a %s, whose layout changes every call; running "
                            "it through torch.compile(backend=\"ltc_cache\")", self._name, exc)
            return self._fall_back(args, kwargs)
        programs = self._by_layout.get(layout)
        full = (self._owner, *args) if self._owner is not None else args
        if programs:
            for program in programs:
                if program is self._frames:
                    return self._run_frames(layout, args, full, kwargs)
                if program.check(program.bind(full, kwargs)):
                    return program.run(full, kwargs)
        elif layout in self._to_fallback:
            return self._fall_back(args, kwargs)
        program = self._obtain(layout, args, kwargs, full)
        if program is None:
            return self._fall_back(args, kwargs)
        if program is self._frames:
            return self._run_frames(layout, args, full, kwargs)
        return program.run(full, kwargs)

    # -- fallback ----------------------------------------------------------------

    def _fall_back(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        counters.bump(PROGRAM_FALLBACKS)
        if self._fallback is None:
            from .dynamo import backend

            self._fallback = torch.compile(self._fallback_target, backend=backend, **self._kwargs)
        return self._fallback(*args, **kwargs)

    def _to_torch_compile(self, layout: Any, why: str) -> None:
        logger.info("%s: %s; running it through torch.compile(backend=\"ltc_cache\")",
                    self._name, why)
        self._to_fallback.add(layout)

    # -- load or capture ---------------------------------------------------------

    def _obtain(self, layout: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                full: tuple[Any, ...]) -> _Loaded | None:
        programs = self._by_layout.setdefault(layout, [])
        if self._frames is not None:  # Dynamo's guards pick frames; new ones are stored
            return self._frames_for(layout, args, kwargs, programs)
        if len(programs) >= _MAX_PROGRAMS:
            self._to_torch_compile(layout, f"{_MAX_PROGRAMS} programs for one input layout")
            return None
        if self._kwargs.get("dynamic"):
            self._to_torch_compile(layout, "dynamic=True (a program is for one input layout)")
            return None
        cache = self.cache
        if cache.store is None:
            self._to_torch_compile(layout, "the cache is disabled or cannot be opened")
            return None
        key = self._key(layout, args, kwargs)
        if key is None:
            return None
        try:
            secret = program_secret(cache.config.secret, cache.config.directory)
        except OSError as exc:
            warn_once("program-key", f"no key to sign programs with ({exc}); "
                      "ltc_cache.compile runs as torch.compile(backend=\"ltc_cache\") "
                      "(LTC_CACHE_SECRET or LTC_CACHE_SECRET_FILE gives the key; else it is "
                      "kept under XDG_CONFIG_HOME)")
            self._to_torch_compile(layout, "no program signing key")
            return None
        # Programs from the shared tier only where the fleet shares a key.
        local_only = cache.config.secret is None
        entry = cache.lookup_entry(key, local_only=local_only)
        if entry is not None:  # a cache hit; counted apart from the LTC graphs' too
            counters.bump(PROGRAM_LOOKUPS)
        program = None
        if entry is not None and entry.kind == "negative":
            changed = changed_source(entry.payload.get("program_sources") or [])
            if changed is None:
                self._to_torch_compile(layout, f"{entry.payload.get('reason')} (remembered in "
                                       f"entry {key.digest[:12]})")
                return None
            logger.info("%s: %s; trying to capture a program again", self._name, changed)
        elif entry is not None:
            program = self._load(entry, key, secret, cache, full, kwargs, local_only)
        if program is self._frames and program is not None:
            self._frames_keys[layout] = (key, local_only)
            counters.bump(PROGRAM_HITS)
            programs.append(program)
            return program
        if program is None:
            program = self._capture(key, secret, cache, layout, full, kwargs, local_only)
            if program is None:
                return None
        else:
            counters.bump(PROGRAM_HITS)
        programs.append(program)
        return program

    def _key(self, layout: Any, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> CacheKey | None:
        """The program key of this call; None (the layout goes to
        torch.compile) where the call cannot be keyed."""
        try:
            return program_key(self._fn, self._owner if isinstance(self._owner, torch.nn.Module)
                               else None, args, kwargs)
        except UncacheableGraph as exc:
            self._to_torch_compile(layout, str(exc))
            return None

    def _load(self, entry: Any, key: CacheKey, secret: bytes, cache: GraphCache,
              full: tuple[Any, ...], kwargs: dict[str, Any],
              local_only: bool) -> _Loaded | None:
        try:
            parts = program_parts(entry, secret)
        except EntryError as exc:
            cache.drop_entry(key, f"program {key.digest[:12]} ({self._name}): {exc}",
                             local_only=local_only)
            return None
        changed = changed_source(parts.sources)
        if changed is not None:
            logger.info("%s: program %s is stale: %s; capturing again", self._name,
                        key.digest[:12], changed)
            return None
        if parts.frames is not None:
            return self._load_frames(parts, key)
        try:
            program = self._materialise(parts.artifact, parts.checks, parts.globals)
        except Exception as exc:
            logger.info("%s: program %s does not load (%s: %s); capturing again", self._name,
                        key.digest[:12], type(exc).__name__, first_line(exc))
            return None
        why = program.resolve(program.bind(full, kwargs))
        if why is not None:
            logger.info("%s: program %s does not fit this call: %s; capturing again",
                        self._name, key.digest[:12], why)
            return None
        logger.info("%s: loaded program %s", self._name, key.digest[:12])
        return program

    def _materialise(self, artifact: bytes, checks: Sequence[Any],
                     direct_globals: Sequence[str]) -> _Loaded:
        from torch._dynamo.aot_compile import AOTCompiledFunction

        loaded = AOTCompiledFunction.deserialize(artifact, f_globals=self._fn.__globals__,
                                                 external_closure_data=self._closure)
        return _Loaded(loaded, _Checks(checks), self._fn.__globals__, direct_globals)

    def _capture(self, key: CacheKey, secret: bytes, cache: GraphCache, layout: Any,
                 full: tuple[Any, ...], kwargs: dict[str, Any],
                 local_only: bool) -> _Loaded | None:
        from torch._dynamo.aot_compile import AOTCompiledFunction
        from torch._dynamo.package import SourceInfo

        counters.bump(PROGRAM_CAPTURES)
        guard_filter = _GuardFilter(self._fn.__globals__)
        codes: list[types.CodeType] = []
        own_sources = self._own_sources()
        try:
            with _recording_traced_code(codes), _once_logging(), _shared_constants_saved():
                compiled = torch.compile(self._fn, fullgraph=True, dynamic=False,
                                         backend=_backend(self._name),
                                         options={"guard_filter_fn": guard_filter})
                artifact = compiled.aot_compile((full, kwargs))
        except Exception as exc:
            from torch._dynamo.exc import Unsupported

            if guard_filter.unportable:  # the guard kept for that made saving fail
                why = f"its program cannot be saved ({guard_filter.unportable})"
            elif isinstance(exc, Unsupported) and self._frames is None:
                # A graph break: Dynamo compiles it as several frames, stored
                # as one program when they are run (:meth:`_run_frames`).
                self._frames = FramesProgram.fresh(self._fn, self._name, _backend(self._name),
                                                   _GuardFilter(self._fn.__globals__))
                self._frames_keys[layout] = (key, local_only)
                return self._frames
            else:
                kind = "graph break" if isinstance(exc, Unsupported) else type(exc).__name__
                why = f"not captured as one graph ({kind}: {first_line(exc)})"
            return self._unportable(key, cache, layout, why, own_sources, local_only)
        try:
            if guard_filter.unportable:
                raise Unportable(guard_filter.unportable)
            sources = _sources(codes)
            env = artifact._artifacts.runtime_env
            # Globals the transformed bytecode reads that aot_compile does
            # not save (Dynamo installs some, e.g. a module it reconstructs).
            missing = (env.external_refs - set(env.import_sources) - set(env.used_globals)
                       - {artifact._artifacts.backend_id})
            for name in missing:
                if name in self._fn.__globals__ and not hasattr(builtins, name):
                    env.used_globals[name] = self._fn.__globals__[name]
            artifact._artifacts.source_info = SourceInfo(inlined_sources=set())
            data = AOTCompiledFunction.serialize(artifact, self._closure).serialized_data
            # This process runs what a later one will load: the same graph
            # (and so the same LTC entries), loaded the same way.
            program = self._materialise(data, guard_filter.checks, guard_filter.globals)
            why = program.resolve(program.bind(full, kwargs))
            if why is not None:
                raise Unportable(f"the reloaded program does not fit the call it was made "
                                 f"for: {why}")
        except Exception as exc:
            reason = str(exc) if isinstance(exc, Unportable) else \
                f"{type(exc).__name__}: {first_line(exc)}"
            return self._unportable(key, cache, layout, f"its program cannot be saved "
                                    f"({reason})", own_sources, local_only)
        graph = artifact._artifacts.compiled_fn
        nodes = len(graph.gm.graph.nodes) if isinstance(graph, LtcProgramGraph) else 0
        entry = program_entry(key, f"{self._name}.program", sources=sources,
                              checks=guard_filter.checks, globals_=guard_filter.globals,
                              artifact=data, secret=secret, node_count=nodes)
        cache.store_entry(entry, key, local_only=local_only)
        logger.info("%s: captured and stored program %s (%d sources, %d portable checks)",
                    self._name, key.digest[:12], len(sources), len(guard_filter.checks))
        return program

    # -- several frames (ltc_cache.frames) ----------------------------------------

    def _load_frames(self, parts: ProgramParts, key: CacheKey) -> FramesProgram | None:
        program = load_program(self._fn, self._name, _backend(self._name),
                               _GuardFilter(self._fn.__globals__), parts, key)
        if program is not None:
            self._frames = program
        return program

    def _frames_for(self, layout: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                    programs: list[Any]) -> FramesProgram | None:
        """A new input layout of a function compiled as frames: Dynamo's
        guards pick (or capture) its frames; the package is stored under
        this layout's key too once it holds new ones."""
        key = self._key(layout, args, kwargs)
        if key is None:
            return None
        self._frames_keys[layout] = (key, self.cache.config.secret is None)
        programs.append(self._frames)
        return self._frames

    def _run_frames(self, layout: Any, args: tuple[Any, ...], full: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
        frames = self._frames
        assert frames is not None
        try:
            out = frames.run(full, kwargs)
        except Exception as exc:
            if frames.dynamo_failed() is None:
                raise  # the user's code's own error
            # Dynamo failed on a frame (the user's code's errors pass through):
            # this function goes to torch.compile from now on.
            warn_once(f"frames-{self._name}", f"ltc_cache.compile: {self._name}'s frames "
                      f"failed ({type(exc).__name__}: {first_line(exc)}); it runs through "
                      "torch.compile(backend=\"ltc_cache\")")
            for known in list(self._by_layout):
                self._by_layout[known] = [p for p in self._by_layout[known] if p is not frames]
                self._to_fallback.add(known)
            self._frames = None
            return self._fall_back(args, kwargs)
        if frames.needs_store():
            key, local_only = self._frames_keys[layout]
            self._store_frames(frames, key, local_only)
        return out

    def _store_frames(self, frames: FramesProgram, key: CacheKey, local_only: bool) -> None:
        # One INFO line a function: later stores (frames a new branch or
        # shape added) at DEBUG.
        first, self._frames_logged = not self._frames_logged, True
        store_program(frames, key, local_only, self.cache, self._name, first)

    def _own_sources(self) -> list[Any]:
        try:
            record = code_record(self._fn.__code__)
        except Unportable:
            return []
        return [record] if record else []

    def _unportable(self, key: CacheKey, cache: GraphCache, layout: Any, why: str,
                    own_sources: list[Any], local_only: bool) -> None:
        cache.store_entry(negative_program_entry(key, f"{self._name}.program", why,
                                                 own_sources), key, local_only=local_only)
        self._to_torch_compile(layout, why)
        return None


def _sources(codes: Sequence[types.CodeType]) -> list[Any]:
    seen, records = set(), []
    for code in codes:
        record = code_record(code)
        if record is not None and tuple(record[:3]) not in seen:
            seen.add(tuple(record[:3]))
            records.append(record)
    return records


# --- the public wrapper --------------------------------------------------------


def _traced_fn(model: Any) -> tuple[types.FunctionType, Any]:
    """The function Dynamo traces for ``model`` and what comes first in its
    arguments (the module, for a module's forward)."""
    from torch._dynamo.convert_frame import get_traced_fn

    return get_traced_fn(model)


def compile(model: Any = None, **kwargs: Any) -> Any:
    """``torch.compile(model, backend="ltc_cache", **kwargs)``, whose warm
    start loads the whole compiled program: no Dynamo capture, no LTC trace.

    Takes a module (returns a :class:`~ltc_cache.compiled_module.CompiledModule`,
    a stand-in for it that training loops take for the module) or a function
    (returns a function), and works as a decorator, with or without
    arguments; any other callable goes to ``torch.compile`` as it is.
    ``kwargs`` are ``torch.compile``'s (``fullgraph``, ``dynamic``,
    ``mode``, ``options``, ``disable``), used where a call goes through
    ``torch.compile``: ``dynamic=True``, or a program that cannot be saved.
    A function Dynamo compiles as several frames (graph breaks) is a program
    of frames (:mod:`ltc_cache.frames`).
    """
    unknown = set(kwargs) - _COMPILE_KWARGS
    if unknown:
        raise TypeError(f"ltc_cache.compile() got unexpected arguments {sorted(unknown)} "
                        "(it always uses the ltc_cache backend)")
    if model is None:
        return functools.partial(compile, **kwargs)
    if kwargs.get("disable"):
        return model
    if isinstance(model, CompiledModule) or hasattr(model, "_ltc_programs"):
        return model  # compiled already
    if isinstance(model, torch.nn.Module):
        fn, owner = _traced_fn(model)
        name = type(model).__name__
        # What falls back to torch.compile is the function the programs
        # run, bound, not the module: a forward replaced after this (Lightning
        # wraps it with the stand-in's) would call the programs again.
        fallback = types.MethodType(fn, owner) if owner is not None else fn
        programs = _Programs(fn, owner, name, kwargs, fallback)
        return stand_in(model, programs, kwargs)
    if isinstance(model, types.FunctionType):
        programs = _Programs(model, None, model.__qualname__, kwargs, model)

        @functools.wraps(model)
        def compiled(*args: Any, **kw: Any) -> Any:
            return programs(args, kw)

        compiled._ltc_programs = programs  # type: ignore[attr-defined]
        return compiled
    if isinstance(model, types.MethodType) and isinstance(model.__self__, torch.nn.Module) \
            and isinstance(model.__func__, types.FunctionType):
        # ``model.forward = ltc_cache.compile(model.forward)``, as transformers
        # documents compiling for generate(): programs of the module's method.
        method, owner = model.__func__, model.__self__
        programs = _Programs(method, owner, type(owner).__name__, kwargs, model)

        @functools.wraps(method)
        def compiled_method(*args: Any, **kw: Any) -> Any:
            return programs(args, kw)

        compiled_method._ltc_programs = programs  # type: ignore[attr-defined]
        return compiled_method
    # Other callables: what torch.compile takes, compiled as it does (no
    # program: Dynamo captures in every process).
    logger.info("ltc_cache.compile: a %s is compiled with torch.compile(backend=\"ltc_cache\")",
                type(model).__name__)
    from .dynamo import backend

    return torch.compile(model, backend=backend, **kwargs)
