"""The background worker: ``python -m ltc_cache.cli.fuse_worker``.

Started by a process that missed (before it has queued anything) or queued
graphs or plans (:mod:`ltc_cache.graph.fused.queue`). The worker holds the
queue's lock and governs (:mod:`ltc_cache.graph.fused.governor`): it runs
the compile in processes of its own, each in a group of its own, one a
core (``--compile N``: the first imports Inductor, then forks the others;
each checks the compiler's ISAs, waits for work while its clients live,
and drains the queue, a library at a time, plans first, at the lowest CPU
priority the system has: :mod:`ltc_cache.compile_backend.fuse_queued`),
which it stops and continues by what the processes that queued the work
leave of the CPU. Its log is ``fuse-queue/worker.log`` in the cache
directory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..graph.fused.governor import Clients
    from ..graph.fused.queue import FuseQueue

__all__ = ["main"]


def lower_priority() -> None:
    """Run only where the CPU is otherwise idle (g++, a child, inherits it)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        with contextlib.suppress(OSError):
            os.nice(19)


def _die_with_parent() -> None:
    """Be killed with the governing worker, even while stopped (Linux's
    ``PR_SET_PDEATHSIG``): a compile never outlives its governor, stopped
    for good."""
    with contextlib.suppress(Exception):
        import ctypes

        parent = os.getppid()
        ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
        if os.getppid() != parent:  # it died before that took hold
            os._exit(1)


# How long a compile process started before anything was queued (its
# client missed, and is tracing) waits for work while its clients live.
WAIT_FOR_WORK_SECONDS = 120.0
# How long the queue stays as it is before a compile process takes a job
# while its clients live (GPT-2 small's step queued its graphs at most 1.4 s
# apart).
QUIET_SECONDS = 3.0


def compile_queue(count: int = 1, report: int | None = None) -> int:
    """The compile: get ready, fork into ``count`` compile processes (their
    pids written to the file descriptor ``report``), and each drain the
    queue, one library at a time, plans first. Returns the worst exit
    status of them all."""
    import time

    started = time.monotonic()
    _die_with_parent()
    lower_priority()
    from ..graph.fused.aoti import check_isas_beside, prepare_compiles

    prepare_compiles()
    logging.getLogger(__name__).info("compiles ready in %.1f s (Inductor imported); %d side "
                                     "by side", time.monotonic() - started, count)
    forked = _forked(count - 1, report)
    check_isas_beside()
    if forked is None:  # a copy: it never returns into the code it was forked in
        code = 1
        try:
            _drain()
            code = 0
        except BaseException:
            logging.getLogger(__name__).exception("a compile process failed")
        finally:
            logging.shutdown()
            os._exit(code)
    _drain()
    code = 0
    for pid in forked:
        with contextlib.suppress(ChildProcessError):
            code = code or os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return code


def _forked(count: int, report: int | None) -> list[int] | None:
    """``count`` copies of this process, each in a process group of its own
    (with the g++ it starts), which the worker stops and continues; their
    pids written to ``report``. A copy shares what this process imported
    (3-4 s of a process's start here) rather than importing it again.
    Returns the pids in this process, None in a copy."""
    import warnings

    pids: list[int] = []
    for _ in range(count if hasattr(os, "fork") else 0):
        # No thread of this process's runs Python here; torch's own idle
        # native thread makes Python 3.12 warn, as it does for every fork of
        # a torch process (DataLoader's workers).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            os.setpgid(0, 0)
            _die_with_parent()
            if report is not None:
                os.close(report)
            return None
        with contextlib.suppress(OSError):  # the copy may have done it first
            os.setpgid(pid, pid)
        pids.append(pid)
    if report is not None:
        with contextlib.suppress(OSError):
            os.write(report, "".join(f"{pid}\n" for pid in pids).encode())
            os.close(report)
    return pids


def _drain() -> None:
    """Wait for work, then drain the queue (this process's share of it)."""
    import dataclasses

    from ..compile_backend.fuse_queued import fuse_queued
    from ..config import CacheConfig
    from ..graph.cache import GraphCache
    from ..graph.fused.aoti import headers_built_after
    from ..graph.fused.build import time_alone_in
    from ..graph.fused.governor import Clients
    from ..graph.fused.queue import FuseQueue

    config = CacheConfig.from_env()
    queue = FuseQueue(config.directory)
    if not _work_comes(queue, Clients(queue.path)):
        return
    time_alone_in(queue.path)  # each library timed with the other compiles stopped
    # The graphs it runs to build and check a plan's library are not queued
    # again from here (nor is this process a client to wait for).
    cache = GraphCache(dataclasses.replace(config, fuse="off"))
    # The libraries first; on a machine's first run, the headers that
    # speed up later compiles after them.
    with headers_built_after():
        fuse_queued(cache, queue, timeout=config.fuse_timeout)


def _work_comes(queue: FuseQueue, clients: Clients) -> bool:
    """Whether the queue holds work, or gets some while its clients live
    (within :data:`WAIT_FOR_WORK_SECONDS`); where it does, once the queue
    has stayed as it is for :data:`QUIET_SECONDS`, or its clients have
    left. A client tracing a training step queues each region as it is
    traced and the plan that covers them in between: GPT-2 small's forward
    regions 5 s before its plan, its backward's over the 9 s after it. A
    compile that took the first it saw compiled two of those regions, for
    nothing."""
    import time

    deadline, seen, since = time.monotonic() + WAIT_FOR_WORK_SECONDS, [], 0.0
    while True:
        now, pending = time.monotonic(), queue.pending()
        if pending != seen:
            seen, since = pending, now
        if pending and now - since >= QUIET_SECONDS:
            return True
        if not clients.alive():
            return bool(pending)
        if not pending and now > deadline:
            return False
        time.sleep(0.1)


def _compiles() -> int:
    """How many compile processes side by side: one a core, at most four
    (a compile holds about a gigabyte); as many run as the governor finds
    cores its clients leave idle."""
    from ..graph.fused.governor import usable_cores

    return max(1, min(usable_cores(), 4))


class _Compiles:
    """The compile processes of one start: the first, started here in a
    process group of its own (the worker's session is its own already:
    start_worker starts it so), and the copies it forks once it is ready,
    whose pids it writes to a pipe."""

    def __init__(self, count: int) -> None:
        read, write = os.pipe()
        command = [sys.executable, "-m", "ltc_cache.cli.fuse_worker", "--compile", str(count),
                   str(write)]
        try:
            self.first = subprocess.Popen(command, pass_fds=(write,),
                                          preexec_fn=lambda: os.setpgid(0, 0))
        finally:
            os.close(write)
        os.set_blocking(read, False)
        self._read, self._groups = read, [self.first.pid]

    def groups(self) -> list[int]:
        """The process groups, the copies' as soon as the first has told."""
        with contextlib.suppress(OSError):  # nothing written yet, or closed
            self._groups += [int(pid) for pid in os.read(self._read, 4096).split()]
        return self._groups

    def wait(self) -> int:
        """The worst exit status of them all (the first waits for its copies)."""
        code = self.first.wait()
        os.close(self._read)
        return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s fuse worker %(process)d: "
                        "%(message)s")
    if argv[:1] == ["--compile"]:
        return compile_queue(*map(int, argv[1:]))
    from ..config import CacheConfig
    from ..graph.fused.governor import Clients, govern
    from ..graph.fused.queue import FuseQueue

    queue = FuseQueue(CacheConfig.from_env().directory)
    clients = Clients(queue.path)
    while True:
        with queue.worker_lock() as held:
            if not held:
                return 0  # another worker drains the queue
            # Started by a client's miss, before anything is queued: the
            # compile processes get ready while it traces, and wait for work.
            waited = not clients.alive()
            while queue.pending() or not waited:
                waited = True
                compiles = _Compiles(_compiles())
                govern(compiles.groups, lambda c=compiles: c.first.poll() is not None,
                       clients, queue.path)
                code = compiles.wait()
                if code != 0:
                    logging.getLogger(__name__).warning("a compile exited with %s; leaving "
                                                        "the rest queued", code)
                    return 1
        if not queue.pending():
            return 0


if __name__ == "__main__":
    sys.exit(main())
