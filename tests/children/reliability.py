"""The child processes of the reliability tests (tests/store/test_reliability_*.py)::

    reliability.py run-models NAME...       extract NAMEs (zoo/reliability_models.py)
        through the cache LTC_CACHE_* configures; print a JSON report
    reliability.py run-models-readonly NAME...   the same, with
        LTC_CACHE_READONLY=1
    reliability.py crash-server DIR PAYLOAD  fork writers on request
    reliability.py mixed DIR SEED OPS        one of the concurrency test's
        processes; waits for a line on stdin, then runs OPS operations
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import torch
from helpers import matches_eager, padded, recorded_warnings

import ltc_cache
from ltc_cache import CacheConfig, GraphCache
from ltc_cache.entries.entry import Entry, decode, encode
from ltc_cache.graph.graph_keys import compute_key
from ltc_cache.store import DiskStore, Store
from zoo.reliability_models import MODELS, build

# -- child processes -------------------------------------------------------

def run_models(names: list[str]) -> dict[str, Any]:
    """Extract each model through the cache LTC_CACHE_* configures, check it
    against eager; report warnings, stats and the directory's check."""
    wrong, failures = [], {}
    with recorded_warnings() as messages:
        for name in names:
            gm, inputs = build(name)
            try:
                compiled = ltc_cache.extract_compiled_graph(gm, inputs, name=name)
                if not matches_eager(gm, compiled, inputs):
                    wrong.append(name)
            except Exception as exc:
                failures[name] = f"{type(exc).__name__}: {exc}"
    return {"stats": ltc_cache.stats(), "warnings": messages, "wrong": wrong,
            "failures": failures}


def crash_server(directory: str, payload: str) -> None:
    """Fork a writer for each ``fork SEED`` line; reap one per ``reap PID``.

    Forking from this process (torch imported once) makes each of the many
    writers cheap to start. A writer announces itself with ``started PID``
    and then stores the payload's entries until it is killed.
    """
    entries = msgpack.unpackb(Path(payload).read_bytes(), raw=False)
    alive: set[int] = set()
    try:
        for line in sys.stdin:
            command, arg = line.split()
            if command == "fork":
                pid = os.fork()
                if pid == 0:
                    try:
                        _die_with_parent()
                        _store_until_killed(Path(directory), entries, int(arg))
                    finally:
                        os._exit(3)  # never reached unless storing failed
                alive.add(pid)
                _say(f"forked {pid}")
            elif command == "reap":
                _, status = os.waitpid(int(arg), 0)
                alive.discard(int(arg))
                _say(f"reaped {arg} {os.waitstatus_to_exitcode(status)}")
    finally:
        # The test ended early: no writer outlives it.
        for pid in alive:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the server dies, however it dies."""
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _say(line: str) -> None:
    # One write() of a short line: atomic on a pipe, so the lines of the
    # server and of its writers, which share its stdout, never interleave.
    os.write(sys.stdout.fileno(), f"{line}\n".encode())


def _store_until_killed(directory: Path, entries: dict[str, bytes], seed: int) -> None:
    # Where the writer got to, one unbuffered line per step, for the test to
    # tell where each kill landed.
    progress = os.open(directory.parent / f"progress.{os.getpid()}",
                       os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    _say(f"started {os.getpid()}")
    rng = random.Random(seed)
    keys = sorted(entries)
    os.write(progress, b"opening\n")
    store = DiskStore(directory)  # opening is part of what may be killed
    while True:
        key = rng.choice(keys)
        # As the cache stores: under the key's lock.
        with store.lock(key, timeout=60):
            os.write(progress, b"storing\n")
            store.put(key, entries[key])
            os.write(progress, b"stored\n")


class CountingStore(Store):
    """A store that counts the events the cache records, per key."""

    def __init__(self, inner: DiskStore) -> None:
        self.inner = inner
        self.events: Counter[tuple[str, str | None]] = Counter()

    def get(self, key):
        return self.inner.get(key)

    def put(self, key, value):
        self.inner.put(key, value)

    def delete(self, key):
        return self.inner.delete(key)

    def keys(self):
        return self.inner.keys()

    def lock(self, key, timeout):
        return self.inner.lock(key, timeout)

    def record(self, event, key):
        self.events[event, key] += 1
        self.inner.record(event, key)


def mixed(directory: str, seed: int, ops: int) -> dict[str, Any]:
    """``ops`` random gets, puts and extracts on keys other processes use too."""
    rng = random.Random(seed)
    store = CountingStore(DiskStore(Path(directory)))
    config = CacheConfig(directory=Path(directory))
    models = {name: build(name) for name in MODELS if name != "deep"}
    graph_keys = {name: compute_key(gm, inputs).digest for name, (gm, inputs) in models.items()}
    template = Entry("", "", (), (), (), {"torch_version": torch.__version__})
    record_keys = [hashlib.sha256(f"record {i}".encode()).hexdigest() for i in range(6)]
    done: Counter[str] = Counter()
    problems: list[str] = []
    sys.stdin.readline()  # every process starts at once
    with recorded_warnings() as messages:
        for _ in range(ops):
            op = rng.choice(("extract", "extract", "get", "get", "put"))
            try:
                if op == "extract":
                    name = rng.choice(sorted(models))
                    gm, inputs = models[name]
                    # A new cache each time: the lookup goes to the store,
                    # not to this process's memory of earlier lookups.
                    compiled = GraphCache(config, store).extract_compiled_graph(gm, inputs)
                    if not matches_eager(gm, compiled, inputs):
                        problems.append(f"wrong result from {name}")
                elif op == "get":
                    key = rng.choice([*graph_keys.values(), *record_keys])
                    data = store.get(key)
                    if data is not None:
                        decode(data, expected_key=key)
                else:
                    key = rng.choice(record_keys)
                    size = rng.choice((100, 5_000, 40_000, 120_000))  # inline and in files
                    store.put(key, encode(padded(template, key, size, rng)))
                done[op] += 1
            except Exception as exc:
                problems.append(f"{op}: {type(exc).__name__}: {exc}")
    traces = {name: store.events["traces", key] for name, key in graph_keys.items()}
    return {"done": dict(done), "problems": problems, "warnings": messages,
            "traces": traces, "stats": ltc_cache.stats()}


def main() -> None:
    command, *args = sys.argv[1:]
    if command == "run-models":
        print(json.dumps(run_models(args)))
    elif command == "run-models-readonly":
        os.environ["LTC_CACHE_READONLY"] = "1"
        print(json.dumps(run_models(args)))
    elif command == "crash-server":
        crash_server(*args)
    elif command == "mixed":
        print(json.dumps(mixed(args[0], int(args[1]), int(args[2]))))
    else:
        raise SystemExit(f"unknown command {command}")


if __name__ == "__main__":
    main()
