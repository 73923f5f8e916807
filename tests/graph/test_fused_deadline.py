"""A compile's time limit counts the time it ran, not the time the worker's
governor kept it stopped (ltc_cache/graph/fused/deadline.py): real
processes, stopped and continued with real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="POSIX signals")

# Runs for ``work`` seconds of its own time (sleeping in slices, as a
# compile waits on g++), under a limit of ``limit`` seconds.
CHILD = """
import sys, time
from ltc_cache.graph.fused.deadline import CompileTimeout, running_deadline
work, limit = float(sys.argv[1]), float(sys.argv[2])
print("started", flush=True)
try:
    with running_deadline(limit):
        ran, last = 0.0, time.monotonic()
        while ran < work:
            time.sleep(0.05)
            now = time.monotonic()
            ran += min(now - last, 0.2)  # a stop is no work
            last = now
    print("done", flush=True)
except CompileTimeout:
    print("timed out", flush=True)
"""


def _run(work: float, limit: float, stop_for: float = 0.0) -> str:
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(work), str(limit)],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "started"
    if stop_for:
        time.sleep(0.3)
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(stop_for)
        os.kill(child.pid, signal.SIGCONT)
    out, _ = child.communicate(timeout=60)
    return out.strip()


def test_the_time_a_compile_was_stopped_does_not_count():
    # 1.5 s of work under a 2.5 s limit, stopped for 3 s: 4.5 s of wall time.
    assert _run(work=1.5, limit=2.5, stop_for=3.0) == "done"


def test_a_compile_that_runs_past_its_limit_is_stopped():
    assert _run(work=4.0, limit=1.0) == "timed out"
