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


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.slow
def test_the_compile_gets_bursts_while_a_client_is_busy_and_all_once_it_exits(tmp_path):
    """Two compile processes (each its own group, as the worker starts
    them) beside a busy client: one burst at a time, never both; each runs
    freely once the client has exited."""
    client = subprocess.Popen([sys.executable, "-c", (
        f"from ltc_cache.graph.fused.governor import register_client\n"
        f"register_client({str(tmp_path)!r})\n" + SPIN.format(seconds=6))])
    compiles = [subprocess.Popen([sys.executable, "-c", SPIN.format(seconds=60)],
                                 start_new_session=True) for _ in range(2)]
    pids = [c.pid for c in compiles]
    clients = governor.Clients(tmp_path)
    stop = threading.Event()
    thread = threading.Thread(target=governor.govern, args=(
        pids, lambda: stop.is_set() or any(c.poll() is not None for c in compiles), clients))
    try:
        deadline = time.monotonic() + 10
        while not (tmp_path / "clients" / str(client.pid)).exists():
            assert time.monotonic() < deadline and client.poll() is None
            time.sleep(0.01)
        thread.start()
        time.sleep(0.5)
        before, started = [_cpu_seconds(p) for p in pids], time.monotonic()
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
    assert both <= 1, both
    assert busy_share <= 2 * governor.BURST_SECONDS / governor.PERIOD_SECONDS + 0.05, busy_share
    assert all(share >= 0.2 for share in idle_shares), idle_shares
    assert not (tmp_path / "clients" / str(client.pid)).exists()  # a gone client is forgotten


def test_a_client_whose_pid_was_reused_is_no_client(tmp_path):
    folder = tmp_path / "clients"
    folder.mkdir()
    (folder / str(os.getpid())).write_text("1")  # this pid, another start time
    clients = governor.Clients(tmp_path)
    clients.cores_used()
    assert clients.cores_used() == 0 and not (folder / str(os.getpid())).exists()
    governor.register_client(tmp_path)
    assert (folder / str(os.getpid())).exists()
    clients.cores_used()
    end = time.process_time() + 0.3
    while time.process_time() < end:  # this process, busy
        pass
    assert clients.cores_used() > governor.BUSY_CORES


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
        [timer.pid, other.pid], stop.is_set, governor.Clients(tmp_path), tmp_path))

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
