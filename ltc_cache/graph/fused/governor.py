"""When the background compile may use the CPU: while the processes that
queued its work are idle or gone, and only in short bursts while they run.

Idle scheduling priority is not enough: on a machine whose cores torch
keeps busy, a compile at ``SCHED_IDLE`` still made a small GPT's training
steps 3-15x slower (it runs in every gap between torch's parallel regions,
and takes the caches and memory bandwidth with it). So the worker's compile
runs in a process group of its own, which the worker stops (``SIGSTOP``)
and continues (``SIGCONT``) as its clients' CPU use says: the processes
that queued graphs (each registers itself in the queue's ``clients``
folder, by pid and start time, so a reused pid is no client).

- A client is **busy** where its main thread ran or waited to run for at
  least :data:`BUSY_CORES` of the last look (every :data:`LOOK_SECONDS`).
  While one is, one compile process (in turn, where there are several)
  gets one burst of :data:`BURST_SECONDS` every :data:`PERIOD_SECONDS`
  (a tenth of a core at most), so a long training run still gets its
  libraries, slowly, and no step loses more than a burst of one core:
  bursts of every compile process at once took both cores of a 2-core
  machine and made a small GPT's step 4.3x its median.
- Otherwise (clients waiting on I/O, between requests, or exited) the
  compile runs freely: most of a short script's libraries are compiled
  right after it exits, for its next run. A compile process that times a
  library against TorchScript (:func:`timed_alone`) runs alone meanwhile:
  beside another compile's g++ a library's team of threads waits for the
  member g++ preempted, and a small GPT's plan library was kept or refused
  by what ran beside its timing.

Linux only (``/proc``): elsewhere the compile runs at idle priority alone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

__all__ = ["BURST_SECONDS", "BUSY_CORES", "LOOK_SECONDS", "PERIOD_SECONDS", "Clients",
           "govern", "register_client", "timed_alone"]

CLIENTS_DIR = "clients"
TIMING_DIR = "timing"
LOOK_SECONDS = 0.05
BUSY_CORES = 0.3
PERIOD_SECONDS = 2.0
BURST_SECONDS = 0.2


def _stat(pid: int) -> tuple[int, float] | None:
    """``(start time, seconds of CPU wanted)`` of process ``pid``, None where
    it is gone. Wanted: its main thread's time on a CPU and waiting for one
    (``/proc/PID/schedstat``), so that a client starved by a loaded machine
    still counts as busy; its CPU time where the kernel keeps no schedstat."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except (OSError, ValueError):
        return None
    # After the command: state is field 3; utime, stime 14, 15; starttime 22.
    start = int(fields[19])
    try:
        with open(f"/proc/{pid}/schedstat") as schedstat:
            running, waiting = schedstat.read().split()[:2]
        return start, (int(running) + int(waiting)) / 1e9
    except (OSError, ValueError):
        return start, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def register_client(queue_dir: Path) -> None:
    """Record this process as a client of the worker of ``queue_dir``.
    Raises OSError where the folder cannot be written."""
    stat = _stat(os.getpid())
    if stat is None:  # no /proc: nothing to govern by
        return
    folder = Path(queue_dir) / CLIENTS_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    (folder / str(os.getpid())).write_text(str(stat[0]))


class Clients:
    """The live clients of a queue and the cores they wanted since the last look."""

    def __init__(self, queue_dir: Path) -> None:
        self._folder = Path(queue_dir) / CLIENTS_DIR
        self._wanted: dict[int, float] = {}
        self._seen = time.monotonic()

    def cores_used(self) -> float:
        """The cores the clients' main threads wanted since the last call (0
        where none is left)."""
        now = time.monotonic()
        elapsed, self._seen = max(now - self._seen, 1e-3), now
        used, wanted = 0.0, {}
        for pid, start in self._entries():
            stat = _stat(pid)
            if stat is None or stat[0] != start:  # exited, or its pid taken by another
                with contextlib.suppress(OSError):
                    (self._folder / str(pid)).unlink()
                continue
            wanted[pid] = stat[1]
            used += stat[1] - self._wanted.get(pid, stat[1])
        self._wanted = wanted
        return used / elapsed

    def _entries(self) -> list[tuple[int, int]]:
        try:
            files = list(self._folder.iterdir())
        except OSError:
            return []
        entries = []
        for file in files:
            with contextlib.suppress(OSError, ValueError):
                entries.append((int(file.name), int(file.read_text())))
        return entries


@contextlib.contextmanager
def timed_alone(queue_dir: Path) -> Iterator[None]:
    """Ask the worker of ``queue_dir`` to run this compile process's group
    alone while its clients are idle, for the block's time (a marker file
    named by the group; without it, where it cannot be written)."""
    marker = Path(queue_dir) / TIMING_DIR / str(os.getpgrp())
    try:
        marker.parent.mkdir(mode=0o700, exist_ok=True)
        marker.touch()
    except OSError:
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            marker.unlink()


def _timing(folder: Path | None, groups: set[int]) -> set[int]:
    """The groups of ``groups`` that asked to run alone."""
    if folder is None:
        return set()
    try:
        names = [f.name for f in folder.iterdir()]
    except OSError:
        return set()
    return {int(n) for n in names if n.isdigit()} & groups


def govern(groups: Sequence[int], done: Callable[[], bool], clients: Clients,
           queue_dir: Path | None = None) -> None:
    """Stop and continue the process groups ``groups`` (the compile
    processes, each with its g++) by their clients' CPU use, and one alone
    while it times a library (:func:`timed_alone` in ``queue_dir``), as the
    module says, until ``done()``; leaves them running."""
    timing = Path(queue_dir) / TIMING_DIR if queue_dir is not None else None
    running = set(groups)
    burst_until, next_burst, turn = 0.0, 0.0, 0
    try:
        while not done():
            time.sleep(LOOK_SECONDS)
            now = time.monotonic()
            if clients.cores_used() < BUSY_CORES:
                alone = _timing(timing, set(groups))
                want = {min(alone)} if alone else set(groups)
            elif now < burst_until:
                want = running
            elif now >= next_burst:
                burst_until, next_burst = now + BURST_SECONDS, now + PERIOD_SECONDS
                want, turn = {groups[turn % len(groups)]}, turn + 1
            else:
                want = set()
            for group in running - want:
                _signal(group, signal.SIGSTOP)
            for group in want - running:
                _signal(group, signal.SIGCONT)
            running = want
    finally:
        for group in groups:
            _signal(group, signal.SIGCONT)


def _signal(group: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is gone
        os.killpg(group, signum)
