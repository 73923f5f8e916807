"""The frames of one function in this process (:class:`FramesProgram`): its
package, the function compiled through Dynamo with that package attached,
and what is stored of it."""

from __future__ import annotations

import inspect
import pickle
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...dynamo_package import backend_wrapped_by, cache_entries, ddp_optimizer_off, optimized
from ...errors import Unportable
from ...threads import compile_lock
from ..program_graph import LtcProgramGraph
from .package import FramePackage
from .portable_checks import add_checks, log_misfits
from .recording import recording

__all__ = ["FramesProgram"]


class FramesProgram:
    """The frames of one function in this process: a package (captured
    here, or loaded and installed), the function compiled through Dynamo
    with that package attached, and what is stored of it."""

    def __init__(self, fn: types.FunctionType, name: str, backend: Callable[..., Any],
                 package: FramePackage, guard_filter: Any, loaded_frames: int = 0) -> None:
        self._fn = fn
        self._name = name
        self.package = package
        self._filter = guard_filter
        # Static shapes, as a single-graph program: a new shape is a
        # recompile of the frames it reaches (and stored under its layout).
        with backend_wrapped_by(_PlainBackend):
            self._compiled = optimized(fn, backend, package, guard_filter)
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
                    ddp_optimizer_off():
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
        for code, dynamo_code, checks in captured:
            if not checks:
                continue
            module = inspect.getmodule(code)
            scope = module.__dict__ if module is not None else {}
            for entry in cache_entries(code):
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
        codes = package.codes()
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
                             package.guarded_count(c)] for c in codes],
                  "breaks": [[reason, count] for reason, count in self.breaks.items()],
                  "skips": list(package.ltc_skips)}
        state = pickle.dumps({"dynamo": entry, "backends": backends})
        self._stored_frames = self.frame_count()
        return state, checks, frames


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
