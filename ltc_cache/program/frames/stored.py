"""A program of frames as a cache entry: stored signed under a layout's key,
and loaded (its signature and sources checked by the caller) by installing
its package, each frame's guard manager given its portable checks."""

from __future__ import annotations

import logging
import pickle
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...dynamo_package import guard_managers_built_by
from ...entries.keys import CacheKey
from ...errors import Unportable, first_line
from ...signing import program_secret
from .. import program_kind  # noqa: F401 - registers the program kind
from ..load_costs import loading
from ..program_entries import ProgramParts, program_entry
from ..program_graph import LtcProgramGraph
from .code_lookup import advance_unique_ids, apply_skips
from .package import FramePackage
from .portable_checks import add_checks
from .program import FramesProgram

if TYPE_CHECKING:
    from ...entries.entry_cache import EntryCache

__all__ = ["describe_breaks", "load_frames", "load_program", "store_program"]

logger = logging.getLogger("ltc_cache.precompile")


def load_frames(fn: types.FunctionType, name: str, backend: Callable[..., Any],
                guard_filter: Any, artifact: bytes, checks: Sequence[Any],
                breaks: Sequence[Any] = (), skips: Sequence[Any] = ()) -> FramesProgram:
    """A stored package installed for ``fn`` (its signature and sources
    checked already by the caller); raises on anything that does not load."""
    # Only ever reached from a program entry whose signature held.
    state = pickle.loads(artifact)
    dynamo, blobs = state["dynamo"], state["backends"]
    package = FramePackage(fn, dynamo, guard_filter)
    backends = {key: _StoredBackend(LtcProgramGraph.deserialize_compile_artifacts(blob))
                for key, blob in blobs.items()}
    by_frame: dict[tuple[int, int], list[Any]] = {}
    for item in checks:
        i, j, frame_checks = item
        by_frame[(int(i), int(j))] = list(frame_checks)
    codes = package.codes()
    try:
        with loading(name):
            _install(package, backends, by_frame, codes)
    except BaseException:
        package.uninstall()  # no half-installed frames left behind
        raise
    # Every module the package installed names in.
    for module in {sys.modules[fn.__module__], *package.installed_modules()}:
        advance_unique_ids(module.__dict__)
    apply_skips(skips)
    package.ltc_skips = [list(record) for record in skips]
    frames = sum(package.guarded_count(code) for code in codes)
    # What was stored is what this package holds: frames added here (a
    # recompile) are stored again.
    package.ltc_frames = [(code, None, by_frame.get((i, j), []))
                          for i, code in enumerate(codes)
                          for j in range(package.guarded_count(code))]
    program = FramesProgram(fn, name, backend, package, guard_filter, loaded_frames=frames)
    program.breaks = {str(reason): int(count) for reason, count in breaks}
    return program


class _StoredBackend:
    """What ``CompilePackage.install`` wants of a stored backend."""

    def __init__(self, fn: Any) -> None:
        self._fn = fn

    def after_deserialization(self) -> Any:
        return self._fn


def _install(package: FramePackage, backends: Mapping[str, Any],
             checks: Mapping[tuple[int, int], list[Any]],
             codes: Sequence[types.CodeType]) -> None:
    """``package.install(backends)``, with each frame's guard manager given
    its portable checks: install builds them code by code, guarded code by
    guarded code, in the package's order, which is the order they were
    recorded in."""
    order = [(i, j) for i, code in enumerate(codes) for j in range(package.guarded_count(code))]
    built = iter(order)

    def with_checks(original: Callable[..., Any]) -> Callable[..., Any]:
        def load_guard_manager(state: Any, target_code: types.CodeType, scope: Any) -> Any:
            manager = original(state, target_code, scope)
            add_checks(manager, checks.get(next(built), []), scope)
            return manager

        return load_guard_manager

    with guard_managers_built_by(with_checks):
        package.install(dict(backends))


def describe_breaks(breaks: Mapping[str, int]) -> str:
    """Dynamo's graph-break reasons in one line (for the log)."""
    if not breaks:
        return "no graph break reason recorded"
    return "; ".join(reason + (f" (x{count})" if count > 1 else "")
                     for reason, count in breaks.items())


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


def store_program(frames: FramesProgram, key: CacheKey, local_only: bool, cache: EntryCache,
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
