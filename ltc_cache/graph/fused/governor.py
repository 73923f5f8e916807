"""When the background compile may use the CPU: while the processes that
queued its work are idle or gone, on the cores they leave idle, and only
in short bursts while they take every core.

Idle scheduling priority is not enough: on a machine whose cores torch
keeps busy, a compile at ``SCHED_IDLE`` still made a small GPT's training
steps 3-15x slower (it runs in every gap between torch's parallel regions,
and takes the caches and memory bandwidth with it). So the worker's compile
runs in process groups of their own, which the worker stops (``SIGSTOP``)
and continues (``SIGCONT``) as its clients' CPU use says: the processes
that queued graphs, or missed and will (each registers itself in the
queue's ``clients`` folder, by pid and start time, so a reused pid is no
client). Every :data:`LOOK_SECONDS` the worker reads what each client's
main thread, and all its threads, ran or waited to run since its last look
(``/proc/PID/schedstat``; a thread starved by a loaded machine still
counts):

- **Idle** (no client's main thread at :data:`BUSY_CORES` of a core:
  clients waiting on I/O, between requests, or exited): every compile
  process runs, but while one times a library against TorchScript
  (:func:`timed_alone`), which runs alone: beside another compile's g++ a
  library's team of threads waits for the member g++ preempted, and a
  small GPT's plan library was kept or refused by what ran beside its
  timing. Most of a short script's libraries are compiled right after it
  exits, for its next run.
- **Leaving cores idle** (a client busy, all clients' threads together
  leaving at least :data:`SPARE_CORE` of the machine's cores): as many
  compile processes as whole cores are left run, none of them timing. A
  process that traces (LTC, Dynamo, AOTAutograd: one thread) leaves one
  core of two idle, where a compile process imports torch and Inductor
  and checks the compiler's vector ISAs, then waits for the queue to
  settle (:mod:`ltc_cache.cli.fuse_worker`). Where the client's threads
  want that core again, they wait for it, which counts as wanting it: the
  compile is stopped at the next look.
- **Busy** (the clients' threads take every core, as training steps do):
  nothing runs for the first :data:`BURSTS_AFTER_SECONDS`; after that one
  compile process (in turn, where there are several) gets one burst of
  :data:`BURST_SECONDS` every :data:`PERIOD_SECONDS` (a tenth of a core at
  most), so a long training run still gets its libraries, slowly, and no
  step loses more than a burst of one core. Bursts of every compile process
  at once took both cores of a 2-core machine and made a small GPT's step
  4.3x its median; one burst of a compile process importing torch, even
  at idle priority, made its step 200 ms against a median of 38 ms, so a
  short run (the small GPT's 40 steps take 1.5 s) gets none.

Linux only (``/proc``): elsewhere the compile runs at idle priority alone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

__all__ = ["BURSTS_AFTER_SECONDS", "BURST_SECONDS", "BUSY_CORES", "LOOK_SECONDS",
           "PERIOD_SECONDS", "SPARE_CORE", "Clients", "Use", "govern", "register_client",
           "timed_alone", "usable_cores"]

CLIENTS_DIR = "clients"
TIMING_DIR = "timing"
LOOK_SECONDS = 0.05
BUSY_CORES = 0.3
SPARE_CORE = 0.8
PERIOD_SECONDS = 2.0
BURST_SECONDS = 0.2
BURSTS_AFTER_SECONDS = 10.0


class Use(NamedTuple):
    """The cores the clients wanted since the last look: the most any one
    client's main thread wanted, and all their threads together."""

    main: float
    whole: float


def _stat(pid: int) -> tuple[int, float, float] | None:
    """``(start time, seconds of CPU its main thread wanted, seconds all its
    threads wanted)`` of process ``pid``, None where it is gone. Wanted: time
    on a CPU and waiting for one (``schedstat``); CPU time where the kernel
    keeps no schedstat."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except (OSError, ValueError):
        return None
    # After the command: state is field 3; utime, stime 14, 15; starttime 22.
    start = int(fields[19])
    main = _wanted(f"/proc/{pid}/schedstat")
    if main is None:
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return start, cpu, cpu
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return start, main, main
    whole = sum(_wanted(f"/proc/{pid}/task/{task}/schedstat") or 0.0 for task in tasks)
    return start, main, max(whole, main)


def _wanted(path: str) -> float | None:
    """Seconds a thread ran and waited to run, from its ``schedstat``."""
    try:
        with open(path) as schedstat:
            running, waiting = schedstat.read().split()[:2]
        return (int(running) + int(waiting)) / 1e9
    except (OSError, ValueError):
        return None


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1


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
        self._wanted: dict[int, tuple[float, float]] = {}
        self._seen = time.monotonic()

    def look(self) -> Use:
        """The cores the clients wanted since the last look (nothing where
        none is left)."""
        now = time.monotonic()
        elapsed, self._seen = max(now - self._seen, 1e-3), now
        main, whole, wanted = 0.0, 0.0, {}
        for pid, stat in self._live():
            wanted[pid] = stat[1:]
            before = self._wanted.get(pid, stat[1:])
            main = max(main, stat[1] - before[0])
            # A thread that ended takes its time along: never less than the main thread's.
            whole += max(stat[2] - before[1], stat[1] - before[0])
        self._wanted = wanted
        return Use(main / elapsed, whole / elapsed)

    def alive(self) -> bool:
        """Whether any client is left."""
        return bool(self._live())

    def _live(self) -> list[tuple[int, tuple[int, float, float]]]:
        """Each live client's pid and :func:`_stat`; a gone one is forgotten."""
        live = []
        for pid, start in self._entries():
            stat = _stat(pid)
            if stat is None or stat[0] != start:  # exited, or its pid taken by another
                with contextlib.suppress(OSError):
                    (self._folder / str(pid)).unlink()
                continue
            live.append((pid, stat))
        return live

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


def govern(groups: Callable[[], Sequence[int]], done: Callable[[], bool], clients: Clients,
           queue_dir: Path | None = None) -> None:
    """Stop and continue the process groups ``groups()`` (the compile
    processes, each with its g++; a group that joins runs until the look
    after) by their clients' CPU use, and one alone while it times a library
    (:func:`timed_alone` in ``queue_dir``), as the module says, until
    ``done()``; leaves them running."""
    timing = Path(queue_dir) / TIMING_DIR if queue_dir is not None else None
    known = set(groups())
    running = set(known)
    burst_until, turn = 0.0, 0
    next_burst = time.monotonic() + BURSTS_AFTER_SECONDS
    cores = usable_cores()
    try:
        while not done():
            time.sleep(LOOK_SECONDS)
            now = time.monotonic()
            use = clients.look()
            current = list(groups())
            running |= set(current) - known  # a copy runs from its fork
            known = set(current)
            alone = _timing(timing, known)
            busy = use.main >= BUSY_CORES
            # The whole cores the clients leave idle (at least SPARE_CORE of one counts).
            spare = int(cores - use.whole + 1 - SPARE_CORE)
            if not busy or spare >= 1:
                next_burst = now + BURSTS_AFTER_SECONDS
            if not busy:
                want = {min(alone)} if alone else set(known)
            elif spare >= 1:  # a client tracing, on one thread
                free = [g for g in current if g not in alone]
                want = set(free[:spare])
            elif now < burst_until:
                want = running
            elif now >= next_burst:
                burst_until, next_burst = now + BURST_SECONDS, now + PERIOD_SECONDS
                want, turn = {current[turn % len(current)]}, turn + 1
            else:
                want = set()
            for group in running - want:
                _signal(group, signal.SIGSTOP)
            for group in want - running:
                _signal(group, signal.SIGCONT)
            running = want
    finally:
        for group in groups():
            _signal(group, signal.SIGCONT)


def _signal(group: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is gone
        os.killpg(group, signum)
