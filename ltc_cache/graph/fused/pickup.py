"""A graph's replay while the background worker compiles its library:
TorchScript until the library is stored, then the library, in the same
process, without a restart.

The worker takes a graph's file out of the queue (:mod:`.queue`) once it
has stored the graph's fused entry, a library or a refusal. So the replay
of a queued graph looks, at most once every :data:`LOOK_SECONDS`, whether
that file is still there (one ``os.stat``, no read of the store); the first
look that finds it gone hands over to ``resolve``, which reads the fused
entry and returns what replays the graph from then on: the library
(verified, loaded and compared on its first call as any library a process
loads) or, where the graph was refused, TorchScript for good. Every other
call costs a clock read.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ..replay import GraphFunction

__all__ = ["LOOK_SECONDS", "PendingFunction"]

# How often a waiting replay looks for its library: a library takes 10-40 s
# of g++, so a second's delay in picking it up is nothing, and a stat a
# second is nothing either.
LOOK_SECONDS = 1.0


class PendingFunction:
    """``fn(*inputs)``: ``script`` (the TorchScript function) until the file
    ``queued`` is gone, then what ``resolve()`` returns (None: ``script``).
    Thread safe: one thread looks and resolves while the others run on."""

    __slots__ = ("_call", "_every", "_lock", "_next_look", "_queued", "_resolve")

    def __init__(self, script: GraphFunction, queued: str,
                 resolve: Callable[[], GraphFunction | None], *,
                 every: float | None = None) -> None:
        self._call = script
        self._queued = queued
        self._resolve = resolve
        self._every = LOOK_SECONDS if every is None else every
        self._next_look = time.monotonic() + self._every
        self._lock = threading.Lock()

    @property
    def waiting(self) -> bool:
        """Whether it still looks for the library."""
        return self._next_look != math.inf

    @property
    def function(self) -> GraphFunction:
        """What runs the calls now."""
        return self._call

    def __call__(self, *inputs: Any) -> Any:
        if time.monotonic() >= self._next_look:
            self._look()
        return self._call(*inputs)

    def _look(self) -> None:
        if not self._lock.acquire(blocking=False):
            return  # another thread is looking: this call runs on what is there now
        try:
            if time.monotonic() < self._next_look:
                return  # looked while this thread waited for the GIL
            try:
                os.stat(self._queued)
            except FileNotFoundError:
                pass
            except OSError:  # cannot tell (a permission, an unmounted volume): later
                self._next_look = time.monotonic() + self._every
                return
            else:
                self._next_look = time.monotonic() + self._every
                return
            self._next_look = math.inf  # the last look, whatever resolve says
            function = self._resolve()
            if function is not None:
                self._call = function
        finally:
            self._lock.release()
