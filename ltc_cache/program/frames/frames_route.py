"""The several-frames route of one function: once Dynamo splits it (a graph
break, at capture; or a program of frames, loaded), every new input layout
runs through the one package of frames, whose guards (Dynamo's, and the
portable checks) pick or capture the frames for a call; the package is
stored under each layout's key once it holds frames a call added."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ...diagnostics import warn_once
from ...entries.keys import CacheKey
from ...errors import first_line
from ...threads import compile_lock
from ..guards import GuardFilter
from ..program_entries import ProgramParts
from ..program_graph import program_backend
from ..route import Call, Program, Target
from .program import FramesProgram
from .stored import load_program, store_program

__all__ = ["FramesRoute", "breaks_the_graph"]


class FramesRoute:
    """The frames of one function (none until the single-graph route hands
    the function over), as the :class:`~ltc_cache.program.route.Route` of
    every new layout and the :class:`~ltc_cache.program.route.Program` of
    each layout that runs through them. ``abandon(program)`` sends every
    layout of the function to torch.compile and takes ``program`` out of
    each layout's list (what a Dynamo failure on a frame leads to)."""

    def __init__(self, target: Target, abandon: Callable[[Program], None]) -> None:
        self._target = target
        self._abandon = abandon
        self._frames: FramesProgram | None = None
        # The key each layout stores the package under, and whether it
        # stays off the shared tier.
        self._keys: dict[Any, tuple[CacheKey, bool]] = {}
        self._logged = False
        # Input layouts whose first call through the frames has been made:
        # until then, calls of a layout are made one at a time, so that
        # Dynamo captures its frames once (it looks for a frame's code
        # before taking its lock, so threads that miss together each
        # capture it).
        self._ran: set[Any] = set()
        self._first = threading.RLock()

    @property
    def active(self) -> bool:
        """Whether the function runs as frames (new layouts come here)."""
        return self._frames is not None

    # -- taking the function over from the single-graph route ----------------------

    def begin(self, layout: Any, key: CacheKey, local_only: bool) -> FramesRoute:
        """Fresh frames, after a capture as one graph met a graph break:
        Dynamo compiles the function as several frames on its next call,
        stored as one program under ``key`` once that call has run."""
        target = self._target
        self._frames = FramesProgram.fresh(target.fn, target.name, program_backend(target.name),
                                           GuardFilter(target.fn.__globals__))
        self._keys[layout] = (key, local_only)
        return self

    def load(self, parts: ProgramParts, key: CacheKey, layout: Any,
             local_only: bool) -> FramesRoute | None:
        """The stored frames of a program entry (its signature and sources
        checked), installed; None (logged) where they do not load."""
        target = self._target
        frames = load_program(target.fn, target.name, program_backend(target.name),
                              GuardFilter(target.fn.__globals__), parts, key)
        if frames is None:
            return None
        self._frames = frames
        self._keys[layout] = (key, local_only)
        return self

    # -- as the route of new layouts ----------------------------------------------

    def obtain(self, call: Call, programs: list[Program]) -> FramesRoute | None:
        """A new input layout: Dynamo's guards pick (or capture) its frames;
        the package is stored under this layout's key too once it holds
        new ones."""
        key = self._target.key(call)
        if key is None:
            return None
        self._keys[call.layout] = (key, self._target.cache.config.secret is None)
        programs.append(self)
        return self

    # -- as a layout's program ----------------------------------------------------

    def fits(self, call: Call) -> bool:
        return True  # each frame's guards are Dynamo's (and ours) on the way

    def run(self, call: Call) -> Any:
        if call.layout in self._ran:  # the steady call
            return self._through_frames(call)
        with self._first:
            out = self._through_frames(call)
            self._ran.add(call.layout)
        return out

    def _through_frames(self, call: Call) -> Any:
        frames = self._frames
        if frames is None:  # they failed in another thread's call since this one began
            return self._target.fallback(call.args, call.kwargs)
        try:
            out = frames.run(call.full, call.kwargs)
        except Exception as exc:
            if frames.dynamo_failed() is None:
                raise  # the user's code's own error
            # Dynamo failed on a frame (the user's code's errors pass through):
            # this function goes to torch.compile from now on.
            name = self._target.name
            warn_once(f"frames-{name}", f"ltc_cache.compile: {name}'s frames failed "
                      f"({type(exc).__name__}: {first_line(exc)}); it runs through "
                      "torch.compile(backend=\"ltc_cache\")")
            with compile_lock():
                self._abandon(self)
                if self._frames is frames:
                    self._frames = None
            return self._target.fallback(call.args, call.kwargs)
        if frames.needs_store():
            with compile_lock():  # stored once, whichever thread's call added frames
                if frames.needs_store():
                    key, local_only = self._keys[call.layout]
                    # One INFO line a function: later stores (frames a new
                    # branch or shape added) at DEBUG.
                    first, self._logged = not self._logged, True
                    store_program(frames, key, local_only, self._target.cache,
                                  self._target.name, first)
        return out


def breaks_the_graph(exc: BaseException) -> bool:
    """Whether Dynamo, not held to one graph, would split the function at
    what made ``exc``: a graph break, or a branch on a tensor's value
    (``if x.any().item():``, Longformer's global attention). Under
    ``fullgraph=True`` the latter is a ``UserError`` raised while handling
    ``GuardOnDataDependentSymNode``; without it, Dynamo breaks the graph at
    the ``item()`` (docs/torch/dynamo.md#item-branch-is-not-a-graph-break)."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    from ...dynamo_package import Unsupported, UserError

    if isinstance(exc, Unsupported):
        return True
    return isinstance(exc, UserError) and isinstance(exc.__context__,
                                                    GuardOnDataDependentSymNode)
