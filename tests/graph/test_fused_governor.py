"""The background compile takes the CPU only while its clients are idle:
real processes, a busy client and a spinning stand-in for g++, governed
as the worker governs its compile (ltc_cache/graph/fused/governor.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from ltc_cache.graph.fused import governor

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="Linux's /proc")

SPIN = "import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass\n"
# A client of the queue in {folder} that keeps {threads} threads busy, its
# main thread among them (hashing lets go of the GIL), for {seconds} s.
CLIENT = """
import hashlib, threading, time
from ltc_cache.graph.fused.governor import register_client
register_client({folder!r})
data, end = bytes(1 << 20), time.time() + {seconds}
def spin():
    while time.time() < end:
        hashlib.sha256(data).digest()
for _ in range({threads} - 1):
    threading.Thread(target=spin).start()
spin()
"""
CORES = len(os.sched_getaffinity(0))


def _wait_registered(client: subprocess.Popen, queue_dir) -> None:
    """Until ``client`` has registered as a client of ``queue_dir``."""
    deadline = time.monotonic() + 10
    while not (queue_dir / "clients" / str(client.pid)).exists():
        assert time.monotonic() < deadline and client.poll() is None
        time.sleep(0.01)


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.slow
def test_the_compile_gets_bursts_while_a_client_is_busy_and_all_once_it_exits(
        tmp_path, monkeypatch):
    """Two compile processes (each its own group, as the worker starts
    them) beside a client that takes every core: nothing at first, then one
    burst at a time, never both; each runs freely once the client has
    exited."""
    monkeypatch.setattr(governor, "BURSTS_AFTER_SECONDS", 1.0)
    client = subprocess.Popen([sys.executable, "-c", CLIENT.format(
        folder=str(tmp_path), threads=CORES, seconds=6)])
    compiles = [subprocess.Popen([sys.executable, "-c", SPIN.format(seconds=60)],
                                 start_new_session=True) for _ in range(2)]
    pids = [c.pid for c in compiles]
    clients = governor.Clients(tmp_path)
    stop = threading.Event()
    thread = threading.Thread(target=governor.govern, args=(
        lambda: pids, lambda: stop.is_set() or any(c.poll() is not None for c in compiles),
        clients))
    try:
        _wait_registered(client, tmp_path)
        thread.start()
        time.sleep(0.3)
        at_first = [_cpu_seconds(p) for p in pids]
        time.sleep(0.5)
        before, started = [_cpu_seconds(p) for p in pids], time.monotonic()
        first_share = (sum(before) - sum(at_first)) / 0.5
        both, last = 0, before
        while time.monotonic() - started < 4.0:  # the client spins throughout
            time.sleep(0.05)
            now = [_cpu_seconds(p) for p in pids]
            both += all(n - b > 0.015 for n, b in zip(now, last, strict=True))
            last = now
        busy_share = (sum(last) - sum(before)) / (time.monotonic() - started)
        assert client.poll() is None, "the client ended early: the window measured nothing"
        client.wait(timeout=30)
        time.sleep(0.5)
        before, started = [_cpu_seconds(p) for p in pids], time.monotonic()
        time.sleep(1.5)
        idle_shares = [(_cpu_seconds(p) - b) / (time.monotonic() - started)
                       for p, b in zip(pids, before, strict=True)]
    finally:
        stop.set()
        thread.join(timeout=10)
        for c in compiles:
            c.kill()
        client.kill()
    # A burst of BURST_SECONDS a PERIOD_SECONDS while busy, to one compile at a
    # time; a good share of a core each (less what the machine's other work
    # takes: tests run beside it) once the client left.
    assert first_share < 0.05, first_share
    assert both <= 1, both
    assert 0.01 < busy_share <= 2 * governor.BURST_SECONDS / governor.PERIOD_SECONDS + 0.05, \
        busy_share
    assert all(share >= 0.2 for share in idle_shares), idle_shares
    assert not (tmp_path / "clients" / str(client.pid)).exists()  # a gone client is forgotten


def test_a_client_whose_pid_was_reused_is_no_client(tmp_path):
    folder = tmp_path / "clients"
    folder.mkdir()
    (folder / str(os.getpid())).write_text("1")  # this pid, another start time
    clients = governor.Clients(tmp_path)
    clients.look()
    assert clients.look() == (0, 0) and not (folder / str(os.getpid())).exists()
    assert not clients.alive()
    governor.register_client(tmp_path)
    assert (folder / str(os.getpid())).exists() and clients.alive()
    clients.look()
    end = time.process_time() + 0.3
    while time.process_time() < end:  # this process, busy
        pass
    use = clients.look()
    assert use.main > governor.BUSY_CORES and use.whole >= use.main


def test_a_compile_that_times_a_library_runs_alone(tmp_path):
    """With no client busy, every compile process runs; while one times a
    library (its marker from timed_alone), the others are stopped, and run
    again once it is done."""
    timer = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from ltc_cache.graph.fused.governor import timed_alone\n"
        f"with timed_alone({str(tmp_path)!r}):\n"
        "    sys.stdin.readline()\n"
        "end = time.time() + 60\n"
        "while time.time() < end: pass\n")], stdin=subprocess.PIPE, text=True,
        start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", SPIN.format(seconds=60)],
                             start_new_session=True)
    stop = threading.Event()
    thread = threading.Thread(target=governor.govern, args=(
        lambda: [timer.pid, other.pid], stop.is_set, governor.Clients(tmp_path), tmp_path))

    def share(pid: int) -> float:
        before, started = _cpu_seconds(pid), time.monotonic()
        time.sleep(1.0)
        return (_cpu_seconds(pid) - before) / (time.monotonic() - started)

    try:
        marker = tmp_path / governor.TIMING_DIR / str(timer.pid)
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert time.monotonic() < deadline and timer.poll() is None
            time.sleep(0.01)
        thread.start()
        time.sleep(0.3)
        while_timing = share(other.pid)
        timer.stdin.write("done\n")
        timer.stdin.flush()
        while marker.exists():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.3)
        after = share(other.pid)
    finally:
        stop.set()
        thread.join(timeout=10)
        for process in (timer, other):
            process.kill()
    assert while_timing < 0.05, while_timing
    assert after >= 0.2, after


@pytest.mark.slow
@pytest.mark.skipif(CORES < 2, reason="a core to spare")
def test_the_compile_takes_the_cores_a_busy_client_leaves_idle(tmp_path):
    """A client busy on one thread (tracing) leaves the machine's other
    cores idle: as many compile processes run as cores are left, the
    others are stopped."""
    client = subprocess.Popen([sys.executable, "-c", CLIENT.format(
        folder=str(tmp_path), threads=1, seconds=8)])
    compiles = [subprocess.Popen([sys.executable, "-c", SPIN.format(seconds=60)],
                                 start_new_session=True) for _ in range(2)]
    pids = [c.pid for c in compiles]
    stop = threading.Event()
    thread = threading.Thread(target=governor.govern, args=(
        lambda: pids, stop.is_set, governor.Clients(tmp_path)))
    try:
        _wait_registered(client, tmp_path)
        thread.start()
        time.sleep(0.5)
        before, started = [_cpu_seconds(p) for p in pids], time.monotonic()
        time.sleep(3.0)
        shares = [(_cpu_seconds(p) - b) / (time.monotonic() - started)
                  for p, b in zip(pids, before, strict=True)]
        assert client.poll() is None, "the client ended early: the window measured nothing"
    finally:
        stop.set()
        thread.join(timeout=10)
        for process in (*compiles, client):
            process.kill()
    running = min(2, CORES - 1)
    assert all(share >= 0.2 for share in shares[:running]), shares
    assert all(share < 0.05 for share in shares[running:]), shares


def test_a_compile_started_at_a_miss_waits_for_work_while_its_clients_live(tmp_path, monkeypatch):
    """A compile process the worker started at a client's miss waits while
    the queue is empty and a client lives, and goes on once work comes; with
    no client left, or past its wait, it leaves."""
    from ltc_cache.cli import fuse_worker
    from ltc_cache.graph.fused.queue import FuseQueue

    queue = FuseQueue(tmp_path)
    queue.path.mkdir()
    clients = governor.Clients(queue.path)
    assert not fuse_worker._work_comes(queue, clients)  # no client: nothing will come
    governor.register_client(queue.path)  # this process, tracing
    timer = threading.Timer(0.3, queue.put, args=("a" * 64,))
    timer.start()
    started = time.monotonic()
    assert fuse_worker._work_comes(queue, clients)
    assert time.monotonic() - started >= 0.25
    queue.done("a" * 64)
    monkeypatch.setattr(fuse_worker, "WAIT_FOR_WORK_SECONDS", 0.2)
    assert not fuse_worker._work_comes(queue, clients)


def test_work_is_taken_once_the_queue_settles_or_its_clients_leave(tmp_path, monkeypatch):
    """A client that traces queues its graphs one by one, the plan that
    covers its regions among them: a compile process takes a job once the
    queue has stayed as it is for QUIET_SECONDS, or at once where no client
    is left."""
    from ltc_cache.cli import fuse_worker
    from ltc_cache.graph.fused.queue import FuseQueue

    monkeypatch.setattr(fuse_worker, "QUIET_SECONDS", 0.5)
    queue = FuseQueue(tmp_path)
    queue.path.mkdir()
    queue.put("a" * 64)
    started = time.monotonic()
    assert fuse_worker._work_comes(queue, governor.Clients(queue.path))  # no client: at once
    assert time.monotonic() - started < 0.3
    governor.register_client(queue.path)  # this process, still queueing
    timer = threading.Timer(0.3, queue.put, args=("b" * 64,))
    timer.start()
    started = time.monotonic()
    assert fuse_worker._work_comes(queue, governor.Clients(queue.path))
    assert time.monotonic() - started >= 0.3 + 0.5 - 0.1


def _normal_priority_once_lowered(pid: int) -> None:
    """Give a compile process that has just lowered its priority its normal
    one back, before it forks (its copies inherit it): at the lowest
    priority, its imports wait for an idle core, which a suite run with a
    worker more than the cores may not leave it for minutes."""
    deadline = time.monotonic() + 30
    while os.sched_getscheduler(pid) != os.SCHED_IDLE:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))


def test_the_first_compile_process_forks_the_others_each_a_group_the_worker_governs(
        tmp_path, monkeypatch):
    """The worker starts one compile process; once it has imported Inductor
    it forks the others, each in a process
    group of its own, and tells the worker their pids (the groups it
    stops and continues). All wait for work while a client lives, and leave
    with it; the first waits for the others."""
    from ltc_cache.cli import fuse_worker

    monkeypatch.setenv("LTC_CACHE_DIR", str(tmp_path))
    queue_dir = tmp_path / "fuse-queue"
    queue_dir.mkdir()
    client = subprocess.Popen([sys.executable, "-c", CLIENT.format(
        folder=str(queue_dir), threads=0, seconds=0) + "time.sleep(120)\n"])
    try:
        _wait_registered(client, queue_dir)
        compiles = fuse_worker._Compiles(3)
        _normal_priority_once_lowered(compiles.first.pid)
        deadline = time.monotonic() + 120
        while len(compiles.groups()) < 3:
            assert time.monotonic() < deadline and compiles.first.poll() is None
            time.sleep(0.1)
        groups = compiles.groups()
        assert len(set(groups)) == 3 and groups[0] == compiles.first.pid
        assert [os.getpgid(pid) for pid in groups] == groups  # each leads its own group
        assert compiles.first.poll() is None  # all waiting for work
    finally:
        client.kill()
        client.wait()
    assert compiles.wait() == 0
    for pid in groups[1:]:  # reaped by the first
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
