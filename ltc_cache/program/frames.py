"""Programs of several frames: a function Dynamo compiles with graph breaks.

Dynamo's AOT precompile (:mod:`ltc_cache.program.precompile`) takes one graph only.
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
  (:func:`ltc_cache.program.describe.describe.code_record`) and compared on load, instead of
  Dynamo's own record (whole module texts it never compares);
- guards Dynamo cannot save become portable checks per frame, added to that
  frame's guard manager (live in the capturing process, and on install in a
  later one) as one lambda guard that resolves them on its first call;
- the artifact (the package's state and every frame's graph) is signed with
  the program's key and unpickled only once the signature holds;
- names the package installs in module globals (resume functions, Dynamo's
  builtins dict) are kept clear of Dynamo's later captures in the process
  (:func:`ltc_cache.program.frame_names.advance_unique_ids`): torch 2.13
  names them from a process-wide counter, and a recompile after a load
  would otherwise reuse one and fail (``Name '__builtins_dict___0' already exists in scope``).
"""

from __future__ import annotations

import inspect
import logging
import pickle
import sys
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..errors import Unportable, first_line
from ..graph.keys import CacheKey
from ..signing import program_secret
from ..threads import compile_lock
from .entries import ProgramParts, program_entry
from .frame_names import advance_unique_ids, apply_skips
from .frame_package import (
    FramePackage,
    StoredBackend,
    add_checks,
    graph_break_reasons,
    install_package,
    log_misfits,
    plain_backend,
    recording,
)
from .load_costs import loading
from .program_graph import LtcProgramGraph

if TYPE_CHECKING:
    from ..graph.cache import GraphCache

__all__ = ["FramesProgram", "describe_breaks", "graph_break_reasons", "load_frames",
           "load_program", "store_program"]

logger = logging.getLogger("ltc_cache.precompile")


# --- per-frame portable checks -------------------------------------------------


# --- the package ---------------------------------------------------------------


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
        with plain_backend():
            self._compiled = torch._dynamo.optimize(backend, package=package, dynamic=False,
                                                    guard_filter_fn=guard_filter)(fn)
        self._stored_frames = loaded_frames  # frames in the stored artifact
        self.breaks: dict[str, int] = {}  # Dynamo's graph-break reasons, captured here
        self.unsaveable: str | None = None
        self._calls = threading.local()  # per thread: what Dynamo raised in its last call

    @classmethod
    def fresh(cls, fn: types.FunctionType, name: str, backend: Callable[..., Any],
              guard_filter: Any) -> FramesProgram:
        package = FramePackage(fn, None, guard_filter)
        return cls(fn, name, backend, package, guard_filter)

    def frame_count(self) -> int:
        return len(self.package.ltc_frames)

    def check(self, f_locals: Mapping[str, Any]) -> bool:
        return True  # each frame's guards are Dynamo's (and ours) on the way

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        return {}

    def run(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """The call, through Dynamo; raises what it raises (where Dynamo
        itself failed, ``dynamo_failed()`` says so). Threads may call at
        once: each call records what its own conversions added."""
        self._calls.failed = None
        # Inside DistributedDataParallel's forward, Dynamo hands each frame
        # to its DDPOptimizer through a callback of its own, without the
        # package (nothing would be recorded): each frame is one graph here,
        # as in a single-graph program, and DDP's own hooks reduce the
        # gradients as backward makes them.
        try:
            # (Dynamo's settings are the calling thread's own.)
            with recording(self.package) as record, \
                    torch._dynamo.config.patch(optimize_ddp=False):
                try:
                    out = self._compiled(*args, **kwargs)
                except BaseException:
                    self._calls.failed = record.error
                    raise
        finally:
            log_misfits(self._name)
        if record.live or record.breaks:  # this call captured frames
            with compile_lock():
                self._check_new_frames(record.live)
                for reason, count in record.breaks.items():
                    self.breaks[reason] = self.breaks.get(reason, 0) + count
        return out

    def dynamo_failed(self) -> BaseException | None:
        """What Dynamo raised converting a frame in this thread's last call,
        if it did."""
        return getattr(self._calls, "failed", None)

    def _check_new_frames(self, captured: Sequence[tuple[Any, Any, list[Any]]]) -> None:
        """Frames captured by the call just made carry their portable checks
        from now on, in this process too."""
        from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

        for code, dynamo_code, checks in captured:
            if not checks:
                continue
            module = inspect.getmodule(code)
            scope = module.__dict__ if module is not None else {}
            for entry in _debug_get_cache_entry_list(code):
                if entry.code is dynamo_code:
                    add_checks(entry.guard_manager, checks, scope)

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
    package = FramePackage(fn, dynamo, guard_filter)
    backends = {key: StoredBackend(LtcProgramGraph.deserialize_compile_artifacts(blob))
                for key, blob in blobs.items()}
    by_frame: dict[tuple[int, int], list[Any]] = {}
    for item in checks:
        i, j, frame_checks = item
        by_frame[(int(i), int(j))] = list(frame_checks)
    codes = list(package._codes)
    try:
        with loading(name):
            install_package(package, backends, by_frame, codes)
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
