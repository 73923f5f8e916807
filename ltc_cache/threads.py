"""The locks that let many threads call compiled callables at once.

A compiled callable's steady call takes no lock. What is not thread-safe
is the work a first call does (docs/serving.md, "Threads"): Dynamo's capture,
AOTAutograd's trace, loading a program, LTC's trace. Each runs at most
once per program, plan and graph in a process: the first thread to need
it takes a lock, looks again (another thread may have made it while it
waited), makes it and publishes it; the others wait and use it.

Two process-wide, reentrant locks, always taken in this order (and the
cache directory's per-key file locks after both):

1. :func:`compile_lock`, Dynamo's own (``torch._dynamo.convert_frame.compile_lock``),
   around captures, program loads and everything the ``torch.compile``
   backend does (AOTAutograd, partitioning, plans). Dynamo holds it while
   it captures and while it calls the backend, so a lock of ltc_cache's
   own taken inside the backend and outside it in another thread would
   deadlock against it; sharing Dynamo's makes that impossible, and keeps
   an AOTAutograd trace (whose FX tracer patches ``nn.Module`` process-wide)
   from overlapping a capture in another thread.
2. :data:`trace_lock`, around an LTC trace and an op probe: LTC counts the
   ops that fall back to eager process-wide (LTC's metrics, read through
   :mod:`ltc_cache.graph.lazy_bindings`), and
   a trace reads them to refuse a graph, so two traces at once would
   swap their verdicts. It is ltc_cache's own, so that a process using
   only ``extract_compiled_graph`` never imports Dynamo (1.9 s).

Nothing runs the user's model while holding either: a first call makes
what runs under the lock, then runs it after releasing it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["SharedPatch", "compile_lock", "trace_lock"]

# One LTC trace (or op probe) at a time in a process; see the module's docstring.
trace_lock = threading.RLock()


def compile_lock() -> contextlib.AbstractContextManager[Any]:
    """Dynamo's process-wide reentrant lock (see the module's docstring);
    imported on first use, by then Dynamo is loaded anyway."""
    from .dynamo_package import compile_lock as lock

    return lock


class SharedPatch:
    """A change to process-wide state (a patched torch method, a module's
    attribute) that calls on several threads need at once: ``apply()`` makes
    it and returns what undoes it; it is in place from the first
    :meth:`held` block to start until the last one ends. Patching around
    each call instead lets one call's undo land while another call still
    needs the patch, or restore the other's patch as "the original",
    leaving it in place for good."""

    def __init__(self, apply: Callable[[], Callable[[], None]]) -> None:
        self._apply = apply
        self._lock = threading.Lock()
        self._holders = 0
        self._undo: Callable[[], None] | None = None

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            if self._holders == 0:
                self._undo = self._apply()
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if self._holders == 0 and self._undo is not None:
                    undo, self._undo = self._undo, None
                    undo()
