"""The programs of one compiled function: which to run for a call, loading
or capturing one for a new input layout, several frames where Dynamo splits
the function, and the fallback to ``torch.compile(backend="ltc_cache")``."""

from __future__ import annotations

import builtins
import logging
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..collector import holding_off
from ..counter_names import PROGRAM_CAPTURES, PROGRAM_FALLBACKS, PROGRAM_HITS, PROGRAM_LOOKUPS
from ..diagnostics import counters, warn_once
from ..errors import EntryError, UncacheableGraph, Unportable, first_line
from ..graph.cache import GraphCache, default_cache
from ..graph.keys import CacheKey, derived_key
from ..kinds import EntryKind
from ..signing import program_secret
from ..threads import compile_lock
from .capture import (
    once_logging,
    recording_traced_code,
    restored_attributes_allowed,
    shared_constants_saved,
    source_records,
)
from .describe import changed_source, code_record
from .entries import (
    ProgramParts,
    negative_program_entry,
    program_entry,
    program_key,
    program_parts,
)
from .frames import FramesProgram, load_program, store_program
from .guards import Checks, GuardFilter
from .load_costs import loading
from .loaded import GrowingLayout, LoadedProgram, call_layout
from .program_graph import LtcProgramGraph, program_backend

logger = logging.getLogger("ltc_cache.precompile")


# Programs kept per input layout before the layout goes to torch.compile
# (Dynamo's recompile limit plays this part there), and stored per layout.
_MAX_PROGRAMS = 8


def _slot_key(key: CacheKey, slot: int) -> CacheKey:
    """The key of a layout's program in ``slot``: the layout's own key for
    the first, a key derived from it for the others. One layout may need
    several programs in turn (a guard on state the first call changes:
    transformers' ``config.problem_type``), and each process meets them in
    the order its calls come (fact 59 in docs/design.md)."""
    return key if slot == 0 else derived_key(key, program_slot=str(slot))


class Programs:
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
        self._by_layout: dict[Any, list[LoadedProgram]] = {}
        self._to_fallback: set[Any] = set()
        self._growing = False
        self._closure = {f"ltc_cache.closure.{i}": cell.cell_contents
                         for i, cell in enumerate(fn.__closure__ or ())}
        # The function's frames where Dynamo compiles it as several (graph
        # breaks): one package a process, which each layout's program adds to.
        self._frames: FramesProgram | None = None
        self._frames_keys: dict[Any, tuple[CacheKey, bool]] = {}
        self._frames_logged = False
        # Input layouts whose first call through the frames has been made:
        # until then, calls of a layout are made one at a time, so that
        # Dynamo captures its frames once (it looks for a frame's code
        # before taking its lock, so threads that miss together each
        # capture it).
        self._frames_ran: set[Any] = set()
        self._frames_first = threading.RLock()
        # The slots (:func:`_slot_key`) of each layout whose programs this
        # process holds.
        self._slots: dict[Any, set[int]] = {}
        # Programs of each layout loaded for a call they did not fit, by
        # slot: tried again (not loaded again) for the layout's next calls.
        self._tried: dict[Any, dict[int, LoadedProgram]] = {}

    @property
    def cache(self) -> GraphCache:
        return self._cache if self._cache is not None else default_cache()

    @property
    def fn(self) -> types.FunctionType:
        """The function the programs compute (a module's forward unbound)."""
        return self._fn

    @property
    def compile_kwargs(self) -> dict[str, Any]:
        """``torch.compile``'s arguments the programs were made with."""
        return self._kwargs

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            layout = (torch.is_grad_enabled(), call_layout(args), call_layout(kwargs))
        except GrowingLayout as exc:
            if not self._growing:
                self._growing = True
                logger.info("%s: called with a %s, whose layout changes every call; running "
                            "it through torch.compile(backend=\"ltc_cache\")", self._name, exc)
            return self._fall_back(args, kwargs)
        full = (self._owner, *args) if self._owner is not None else args
        program = self._pick(layout, full, kwargs)  # the steady call: no lock
        if program is None:
            if layout in self._to_fallback:
                return self._fall_back(args, kwargs)
            # One load or capture a layout: threads calling together wait for
            # the first, then run what it made (ltc_cache/threads.py).
            with compile_lock():
                program = self._pick(layout, full, kwargs)
                if program is None and layout not in self._to_fallback:
                    program = self._obtain(layout, args, kwargs, full)
            if program is None:
                return self._fall_back(args, kwargs)
        if isinstance(program, FramesProgram):
            return self._run_frames(program, layout, args, full, kwargs)
        return program.run(full, kwargs)

    def _pick(self, layout: Any, full: tuple[Any, ...],
              kwargs: dict[str, Any]) -> LoadedProgram | FramesProgram | None:
        """The program of ``layout`` whose guards and checks hold for this
        call (the frames, where the function is compiled as frames: Dynamo's
        guards pick among them); None where none does."""
        for program in self._by_layout.get(layout, ()):
            if program is self._frames or program.check(program.bind(full, kwargs)):
                return program
        return None

    # -- fallback ----------------------------------------------------------------

    def _fall_back(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        counters.bump(PROGRAM_FALLBACKS)
        fallback = self._fallback
        if fallback is None:
            from ..compile_backend.backend import backend

            with compile_lock():
                if self._fallback is None:
                    self._fallback = torch.compile(self._fallback_target, backend=backend,
                                                   **self._kwargs)
                fallback = self._fallback
        return fallback(*args, **kwargs)

    def _to_torch_compile(self, layout: Any, why: str) -> None:
        logger.info("%s: %s; running it through torch.compile(backend=\"ltc_cache\")",
                    self._name, why)
        self._to_fallback.add(layout)

    # -- load or capture ---------------------------------------------------------

    def _obtain(self, layout: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                full: tuple[Any, ...]) -> LoadedProgram | None:
        """A program loaded or captured for this call (its layout's list
        holds it once it is ready to run); None where the layout goes to
        torch.compile. Called holding the compile lock."""
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
        held = self._slots.setdefault(layout, set())
        tried = self._tried.setdefault(layout, {})
        # The layout's stored programs, one a slot (fact 59 in docs/design.md):
        # the first that fits this call is loaded; a capture goes into the
        # first slot that is empty, stale or broken, never over a program
        # that serves other calls of this layout.
        target: tuple[int, CacheKey] | None = None  # where a capture is stored
        empty = _MAX_PROGRAMS - 1  # every slot serves other calls: the last is replaced
        for slot in range(_MAX_PROGRAMS):
            if slot in held:  # loaded or captured by this process already
                continue
            slot_key = _slot_key(key, slot)
            program = tried.pop(slot, None)  # loaded for an earlier call it did not fit
            if program is not None:
                if not self._fits(program, slot_key, full, kwargs):
                    tried[slot] = program
                    continue
            else:
                entry = cache.lookup_entry(slot_key, local_only=local_only)
                if entry is None:  # slots fill in order: none after it
                    empty = slot
                    break
                counters.bump(PROGRAM_LOOKUPS)  # a cache hit, apart from the LTC graphs'
                if entry.kind == EntryKind.NEGATIVE:
                    changed = changed_source(entry.payload.get("program_sources") or [])
                    if changed is None:
                        self._to_torch_compile(layout, f"{entry.payload.get('reason')} "
                                               f"(remembered in entry {slot_key.digest[:12]})")
                        return None
                    logger.info("%s: %s; trying to capture a program again", self._name,
                                changed)
                    target = target or (slot, slot_key)
                    break
                program = self._load(entry, slot_key, secret, cache, local_only)
                if program is None:  # stale or broken: a capture replaces it
                    target = target or (slot, slot_key)
                    continue
                if isinstance(program, LoadedProgram) \
                        and not self._fits(program, slot_key, full, kwargs):
                    tried[slot] = program  # another call of this layout may need it
                    continue
            held.add(slot)
            if program is self._frames:
                self._frames_keys[layout] = (slot_key, local_only)
            counters.bump(PROGRAM_HITS)
            programs.insert(0, program)
            return program
        slot, slot_key = target or (empty, _slot_key(key, empty))
        tried.pop(slot, None)  # (the program this capture replaces)
        program = self._capture(slot_key, secret, cache, layout, full, kwargs, local_only)
        if program is None:
            return None
        held.add(slot)
        # The newest first: a layout's later programs are usually made for
        # state its first call changed, which the calls after it keep.
        programs.insert(0, program)
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

    @holding_off()  # fact 46 in docs/design.md
    def _load(self, entry: Any, key: CacheKey, secret: bytes, cache: GraphCache,
              local_only: bool) -> LoadedProgram | FramesProgram | None:
        """The program of ``entry`` (:meth:`_fits` tells whether it fits
        this call); None where it is stale or does not load (a capture
        replaces it)."""
        try:
            parts = program_parts(entry, secret)
        except EntryError as exc:
            cache.drop_entry(key, f"program {key.digest[:12]} ({self._name}): {exc}",
                             local_only=local_only)
            return None
        changed = changed_source(parts.sources, parts.source_stats)
        if changed is not None:
            logger.info("%s: program %s is stale: %s; capturing again", self._name,
                        key.digest[:12], changed)
            return None
        if parts.frames is not None:
            return self._load_frames(parts, key)
        try:
            program = self._materialise(parts.artifact, parts.checks, parts.globals,
                                        parts.checks_code)
        except Exception as exc:
            logger.info("%s: program %s does not load (%s: %s); capturing again", self._name,
                        key.digest[:12], type(exc).__name__, first_line(exc))
            return None
        return program

    @holding_off()  # (resolving compiles the checks: part of the load)
    def _fits(self, program: LoadedProgram, key: CacheKey, full: tuple[Any, ...],
              kwargs: dict[str, Any]) -> bool:
        """Whether a loaded program's guards and checks hold for this call;
        one made for other calls of the layout is logged, and kept."""
        why = program.resolve(program.bind(full, kwargs))
        if why is None:
            logger.info("%s: loaded program %s", self._name, key.digest[:12])
            return True
        logger.info("%s: program %s does not fit this call: %s; trying the layout's next "
                    "program", self._name, key.digest[:12], why)
        return False

    def _materialise(self, artifact: bytes, checks: Sequence[Any],
                     direct_globals: Sequence[str],
                     checks_code: Sequence[Any] = ()) -> LoadedProgram:
        from torch._dynamo.aot_compile import AOTCompiledFunction

        with loading(self._name):
            loaded = AOTCompiledFunction.deserialize(artifact, f_globals=self._fn.__globals__,
                                                     external_closure_data=self._closure)
        return LoadedProgram(loaded, Checks(checks, checks_code), self._fn.__globals__,
                             direct_globals)

    def _capture(self, key: CacheKey, secret: bytes, cache: GraphCache, layout: Any,
                 full: tuple[Any, ...], kwargs: dict[str, Any],
                 local_only: bool) -> LoadedProgram | None:
        from torch._dynamo.aot_compile import AOTCompiledFunction
        from torch._dynamo.package import SourceInfo

        counters.bump(PROGRAM_CAPTURES)
        guard_filter = GuardFilter(self._fn.__globals__)
        codes: list[types.CodeType] = []
        own_sources = self._own_sources()
        try:
            with recording_traced_code(codes), once_logging(), shared_constants_saved(), \
                    restored_attributes_allowed():
                compiled = torch.compile(self._fn, fullgraph=True, dynamic=False,
                                         backend=program_backend(self._name),
                                         options={"guard_filter_fn": guard_filter})
                artifact = compiled.aot_compile((full, kwargs))
        except Exception as exc:
            from torch._dynamo.exc import Unsupported

            if guard_filter.unportable:  # the guard kept for that made saving fail
                why = f"its program cannot be saved ({guard_filter.unportable})"
            elif breaks_the_graph(exc) and self._frames is None:
                # A graph break: Dynamo compiles it as several frames, stored
                # as one program when they are run (:meth:`_run_frames`).
                self._frames = FramesProgram.fresh(self._fn, self._name,
                                                   program_backend(self._name),
                                                   GuardFilter(self._fn.__globals__))
                self._frames_keys[layout] = (key, local_only)
                return self._frames
            else:
                kind = "graph break" if isinstance(exc, Unsupported) else type(exc).__name__
                why = f"not captured as one graph ({kind}: {first_line(exc)})"
            return self._unportable(key, cache, layout, why, own_sources, local_only)
        try:
            if guard_filter.unportable:
                raise Unportable(guard_filter.unportable)
            sources = source_records(codes)
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
                              artifact=data, secret=secret, node_count=nodes,
                              checks_code=program.compiled_checks())
        cache.store_entry(entry, key, local_only=local_only)
        logger.info("%s: captured and stored program %s (%d sources, %d portable checks)",
                    self._name, key.digest[:12], len(sources), len(guard_filter.checks))
        return program

    # -- several frames (ltc_cache.program.frames) --------------------------------

    def _load_frames(self, parts: ProgramParts, key: CacheKey) -> FramesProgram | None:
        program = load_program(self._fn, self._name, program_backend(self._name),
                               GuardFilter(self._fn.__globals__), parts, key)
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

    def _run_frames(self, frames: FramesProgram, layout: Any, args: tuple[Any, ...],
                    full: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if layout in self._frames_ran:  # the steady call
            return self._through_frames(frames, layout, args, full, kwargs)
        with self._frames_first:
            out = self._through_frames(frames, layout, args, full, kwargs)
            self._frames_ran.add(layout)
        return out

    def _through_frames(self, frames: FramesProgram, layout: Any, args: tuple[Any, ...],
                        full: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
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
            with compile_lock():
                for known in list(self._by_layout):
                    self._to_fallback.add(known)
                    self._by_layout[known] = [p for p in self._by_layout[known]
                                              if p is not frames]
                if self._frames is frames:
                    self._frames = None
            return self._fall_back(args, kwargs)
        if frames.needs_store():
            with compile_lock():  # stored once, whichever thread's call added frames
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


def breaks_the_graph(exc: BaseException) -> bool:
    """Whether Dynamo, not held to one graph, would split the function at
    what made ``exc``: a graph break, or a branch on a tensor's value
    (``if x.any().item():``, Longformer's global attention). Under
    ``fullgraph=True`` the latter is a ``UserError`` raised while handling
    ``GuardOnDataDependentSymNode``; without it, Dynamo breaks the graph at
    the ``item()`` (fact 42 in docs/design.md)."""
    from torch._dynamo.exc import Unsupported, UserError
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    if isinstance(exc, Unsupported):
        return True
    return isinstance(exc, UserError) and isinstance(exc.__context__,
                                                    GuardOnDataDependentSymNode)
