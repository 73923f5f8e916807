"""The single-graph route of one function: each input layout's programs,
one a slot under the layout's key (docs/torch/dynamo.md#one-layout-several-programs), loaded from
the cache or captured whole by Dynamo's AOT precompile and stored. A
function Dynamo cannot capture as one graph, or whose stored program is one
of frames, is handed to the several-frames route (:mod:`.frames`)."""

from __future__ import annotations

import logging
import types
from collections.abc import Sequence
from typing import Any, NamedTuple

from ..collector import holding_off
from ..counter_names import PROGRAM_CAPTURES, PROGRAM_HITS, PROGRAM_LOOKUPS
from ..diagnostics import counters, warn_once
from ..dynamo_package import (
    aot_compiled,
    deserialize_program,
    program_graph,
    serialize_program,
)
from ..entries.entry_cache import EntryCache
from ..entries.keys import CacheKey, derived_key
from ..entries.kinds import EntryKind
from ..errors import EntryError, Unportable, first_line
from ..signing import program_secret
from . import program_kind  # noqa: F401 - registers the program kind
from .capture import (
    once_logging,
    recording_traced_code,
    restored_attributes_allowed,
    shared_constants_saved,
    source_records,
)
from .describe import changed_source, code_record
from .frames import FramesRoute, breaks_the_graph
from .guards import Checks, GuardFilter
from .load_costs import loading
from .loaded import LoadedProgram
from .program_entries import negative_program_entry, program_entry, program_parts
from .program_graph import LtcProgramGraph, program_backend
from .route import Call, Program, Target

__all__ = ["MAX_PROGRAMS", "SingleGraphRoute"]

logger = logging.getLogger("ltc_cache.precompile")


# Programs kept per input layout before the layout goes to torch.compile
# (Dynamo's recompile limit plays this part there), and stored per layout.
MAX_PROGRAMS = 8


def _slot_key(key: CacheKey, slot: int) -> CacheKey:
    """The key of a layout's program in ``slot``: the layout's own key for
    the first, a key derived from it for the others. One layout may need
    several programs in turn (a guard on state the first call changes:
    transformers' ``config.problem_type``), and each process meets them in
    the order its calls come (docs/torch/dynamo.md#one-layout-several-programs)."""
    return key if slot == 0 else derived_key(key, program_slot=str(slot))


class _Store(NamedTuple):
    """Where a layout's programs are kept: the cache, the layout's key (its
    first slot's), the key programs are signed with, and whether they stay
    off the shared tier (they do unless the fleet shares a key)."""

    cache: EntryCache
    key: CacheKey
    secret: bytes
    local_only: bool


class SingleGraphRoute:
    """The programs of a function captured as one graph, per input layout;
    ``frames`` takes the function over where it is not one graph."""

    def __init__(self, target: Target, frames: FramesRoute) -> None:
        self._target = target
        self._frames = frames
        # The slots of each layout whose programs this process holds.
        self._held: dict[Any, set[int]] = {}
        # Programs of each layout loaded for a call they did not fit, by
        # slot: tried again (not loaded again) for the layout's next calls.
        self._tried: dict[Any, dict[int, LoadedProgram]] = {}

    def obtain(self, call: Call, programs: list[Program]) -> Program | None:
        """The layout's stored program that fits the call, else one captured
        for it (as :meth:`~ltc_cache.program.route.Route.obtain` says)."""
        store = self._store(call, programs)
        if store is None:
            return None
        found = self._look_up(call, store)
        if found is None:  # a remembered refusal: the layout goes to torch.compile
            return None
        slot, program = found
        if program is not None:
            counters.bump(PROGRAM_HITS)
        else:
            self._tried[call.layout].pop(slot, None)  # (the program this capture replaces)
            program = self._capture(call, store, _slot_key(store.key, slot))
            if program is None:
                return None
        self._held[call.layout].add(slot)
        # The newest first: a layout's later programs are usually made for
        # state its first call changed, which the calls after it keep.
        programs.insert(0, program)
        return program

    def _store(self, call: Call, programs: list[Program]) -> _Store | None:
        """Where this layout's programs are kept; None where the layout
        goes to torch.compile (the fallback is told why)."""
        target, layout = self._target, call.layout
        if len(programs) >= MAX_PROGRAMS:
            target.fallback.send(layout, f"{MAX_PROGRAMS} programs for one input layout")
            return None
        if target.compile_kwargs.get("dynamic"):
            target.fallback.send(layout, "dynamic=True (a program is for one input layout)")
            return None
        cache = target.cache
        if cache.store is None:
            target.fallback.send(layout, "the cache is disabled or cannot be opened")
            return None
        key = target.key(call)
        if key is None:
            return None
        try:
            secret = program_secret(cache.config.secret, cache.config.directory)
        except OSError as exc:
            warn_once("program-key", f"no key to sign programs with ({exc}); "
                      "ltc_cache.compile runs as torch.compile(backend=\"ltc_cache\") "
                      "(LTC_CACHE_SECRET or LTC_CACHE_SECRET_FILE gives the key; else it is "
                      "kept under XDG_CONFIG_HOME)")
            target.fallback.send(layout, "no program signing key")
            return None
        return _Store(cache, key, secret, cache.config.secret is None)

    def _look_up(self, call: Call, store: _Store) -> tuple[int, Program | None] | None:
        """The layout's stored programs, one a slot: the first that fits
        this call, loaded, with its slot; else the slot a capture goes into
        (the first that is empty, stale or broken, never one whose program
        serves other calls of this layout) and no program; None where a
        negative entry sends the layout to torch.compile."""
        held = self._held.setdefault(call.layout, set())
        tried = self._tried.setdefault(call.layout, {})
        replaced: int | None = None  # the first stale or broken slot
        for slot in range(MAX_PROGRAMS):
            if slot in held:  # loaded or captured by this process already
                continue
            key = _slot_key(store.key, slot)
            program: Program | None = tried.pop(slot, None)
            if program is None:
                entry = store.cache.lookup_entry(key, local_only=store.local_only)
                if entry is None:  # slots fill in order: none after it
                    return (slot if replaced is None else replaced), None
                counters.bump(PROGRAM_LOOKUPS)  # a cache hit, apart from the LTC graphs'
                if entry.kind == EntryKind.NEGATIVE:
                    if not self._captured_again(call, entry, key):
                        return None
                    return (slot if replaced is None else replaced), None
                program = self._load(entry, key, store, call.layout)
                if program is None:  # stale or broken: a capture replaces it
                    replaced = slot if replaced is None else replaced
                    continue
            # (A program of frames fits every call: Dynamo's guards pick its frames.)
            if isinstance(program, LoadedProgram) and not self._fits(program, key, call):
                tried[slot] = program  # another call of this layout may need it
                continue
            return slot, program
        # Every slot serves other calls: the last is replaced.
        return (MAX_PROGRAMS - 1 if replaced is None else replaced), None

    def _captured_again(self, call: Call, entry: Any, key: CacheKey) -> bool:
        """Whether the layout of a negative entry is captured again (a
        source the entry recorded changed); where not, it goes to
        torch.compile."""
        changed = changed_source(entry.payload.get("program_sources") or [])
        if changed is None:
            self._target.fallback.send(call.layout, f"{entry.payload.get('reason')} "
                                       f"(remembered in entry {key.digest[:12]})")
            return False
        logger.info("%s: %s; trying to capture a program again", self._target.name, changed)
        return True

    # -- load --------------------------------------------------------------------

    @holding_off()  # docs/torch/dynamo.md#cyclic-gc-during-warm-loads
    def _load(self, entry: Any, key: CacheKey, store: _Store, layout: Any) -> Program | None:
        """The program of ``entry`` (:meth:`_fits` tells whether one of a
        single graph fits this call); None where it is stale or does not
        load (a capture replaces it)."""
        name = self._target.name
        try:
            parts = program_parts(entry, store.secret)
        except EntryError as exc:
            store.cache.drop_entry(key, f"program {key.digest[:12]} ({name}): {exc}",
                                   local_only=store.local_only)
            return None
        changed = changed_source(parts.sources, parts.source_stats)
        if changed is not None:
            logger.info("%s: program %s is stale: %s; capturing again", name, key.digest[:12],
                        changed)
            return None
        if parts.frames is not None:  # several frames: they run the function from now on
            return self._frames.load(parts, key, layout, store.local_only)
        try:
            return self._materialise(parts.artifact, parts.checks, parts.globals,
                                     parts.checks_code)
        except Exception as exc:
            logger.info("%s: program %s does not load (%s: %s); capturing again", name,
                        key.digest[:12], type(exc).__name__, first_line(exc))
            return None

    @holding_off()  # (resolving compiles the checks, which is part of the load)
    def _fits(self, program: LoadedProgram, key: CacheKey, call: Call) -> bool:
        """Whether a loaded program's guards and checks hold for this call;
        one made for other calls of the layout is logged, and kept."""
        why = program.resolve(program.bind(call.full, call.kwargs))
        if why is None:
            logger.info("%s: loaded program %s", self._target.name, key.digest[:12])
            return True
        logger.info("%s: program %s does not fit this call: %s; trying the layout's next "
                    "program", self._target.name, key.digest[:12], why)
        return False

    def _materialise(self, artifact: bytes, checks: Sequence[Any],
                     direct_globals: Sequence[str],
                     checks_code: Sequence[Any] = ()) -> LoadedProgram:
        fn_globals = self._target.fn.__globals__
        with loading(self._target.name):
            loaded = deserialize_program(artifact, fn_globals, self._target.closure)
        return LoadedProgram(loaded, Checks(checks, checks_code), fn_globals, direct_globals)

    # -- capture -----------------------------------------------------------------

    def _capture(self, call: Call, store: _Store, key: CacheKey) -> Program | None:
        """Capture the function as one graph for this call, store its
        program under ``key`` and return it, as a later process loads it;
        a graph break hands the function to the several-frames route; a
        program that cannot be saved is remembered in a negative entry (the
        layout goes to torch.compile)."""
        target = self._target
        counters.bump(PROGRAM_CAPTURES)
        # A cold run's first miss: the fused tier's worker starts now, so that
        # its compile imports Inductor on the core Dynamo's trace leaves idle
        # (a small GPT's plan misses 1.5 s later; its compile got ready
        # 0.4-0.9 s sooner for this).
        target.cache.fused.expect_work()
        guard_filter = GuardFilter(target.fn.__globals__)
        codes: list[types.CodeType] = []
        own_sources = self._own_sources()
        try:
            with recording_traced_code(codes), once_logging(), shared_constants_saved(), \
                    restored_attributes_allowed():
                artifact = aot_compiled(target.fn, program_backend(target.name), guard_filter,
                                        call.full, call.kwargs)
        except Exception as exc:
            from ..dynamo_package import Unsupported

            if guard_filter.unportable:  # the guard kept for that made saving fail
                why = f"its program cannot be saved ({guard_filter.unportable})"
            elif breaks_the_graph(exc) and not self._frames.active:
                # A graph break: Dynamo compiles it as several frames, stored
                # as one program when they are run.
                return self._frames.begin(call.layout, key, store.local_only)
            else:
                kind = "graph break" if isinstance(exc, Unsupported) else type(exc).__name__
                why = f"not captured as one graph ({kind}: {first_line(exc)})"
            return self._unportable(call, store, key, why, own_sources)
        try:
            if guard_filter.unportable:
                raise Unportable(guard_filter.unportable)
            sources = source_records(codes)
            data = serialize_program(artifact, target.fn.__globals__, target.closure)
            # This process runs what a later one will load: the same graph
            # (and so the same LTC entries), loaded the same way.
            program = self._materialise(data, guard_filter.checks, guard_filter.globals)
            why = program.resolve(program.bind(call.full, call.kwargs))
            if why is not None:
                raise Unportable(f"the reloaded program does not fit the call it was made "
                                 f"for: {why}")
        except Exception as exc:
            reason = str(exc) if isinstance(exc, Unportable) else \
                f"{type(exc).__name__}: {first_line(exc)}"
            return self._unportable(call, store, key, f"its program cannot be saved ({reason})",
                                    own_sources)
        graph = program_graph(artifact)
        nodes = len(graph.gm.graph.nodes) if isinstance(graph, LtcProgramGraph) else 0
        entry = program_entry(key, f"{target.name}.program", sources=sources,
                              checks=guard_filter.checks, globals_=guard_filter.globals,
                              artifact=data, secret=store.secret, node_count=nodes,
                              checks_code=program.compiled_checks())
        store.cache.store_entry(entry, key, local_only=store.local_only)
        logger.info("%s: captured and stored program %s (%d sources, %d portable checks)",
                    target.name, key.digest[:12], len(sources), len(guard_filter.checks))
        return program

    def _unportable(self, call: Call, store: _Store, key: CacheKey, why: str,
                    own_sources: list[Any]) -> None:
        """Remember that this layout's program cannot be made (until the
        function's source changes), and send the layout to torch.compile."""
        entry = negative_program_entry(key, f"{self._target.name}.program", why, own_sources)
        store.cache.store_entry(entry, key, local_only=store.local_only)
        self._target.fallback.send(call.layout, why)

    def _own_sources(self) -> list[Any]:
        try:
            record = code_record(self._target.fn.__code__)
        except Unportable:
            return []
        return [record] if record else []

