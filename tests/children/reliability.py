"""Models, helpers and child processes of the reliability tests.

Run as a script it is one of the children those tests start::

    reliability_workers.py run-models NAME...       extract NAMEs through the
        cache LTC_CACHE_* configures; print a JSON report
    reliability_workers.py run-models-readonly NAME...   the same, with
        LTC_CACHE_READONLY=1
    reliability_workers.py crash-server DIR PAYLOAD  fork writers on request
    reliability_workers.py mixed DIR SEED OPS        one of the concurrency test's
        processes; waits for a line on stdin, then runs OPS operations
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import signal
import sys
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgpack
import torch
from torch import fx, nn

import ltc_cache
from ltc_cache import CacheConfig, GraphCache
from ltc_cache.graph.entry import Entry, decode, encode
from ltc_cache.graph.keys import compute_key
from ltc_cache.store import DiskStore, Store
from ltc_cache.wire import FORMAT, SCHEMA_VERSION, is_entry_key

WORKERS = Path(__file__)

# name -> (depth, width, batch, scale). "deep" has ~43 KB of IR: diskcache
# keeps it in a file of its own (values >= 32 KB), the others inside its
# database. A scale is a scalar the trace captures: a stored constant.
MODELS = {
    "mlp1": (1, 8, 2, None),
    "mlp2": (2, 8, 2, None),
    "mlp2-wide": (2, 16, 2, None),
    "mlp2-batch3": (2, 8, 3, None),
    "scaled": (2, 8, 2, 2.5),
    "deep": (200, 4, 2, None),
}


class _Scaled(nn.Module):
    def __init__(self, body: nn.Module, scale: float) -> None:
        super().__init__()
        self.body = body
        self.scale = scale

    def forward(self, x):
        return self.body(x) * self.scale + 1


def build(name: str) -> tuple[fx.GraphModule, list[torch.Tensor]]:
    """The model ``name`` with fixed weights, and its example input."""
    depth, width, batch, scale = MODELS[name]
    gen = torch.Generator().manual_seed(depth * 1000 + width)
    layers: list[nn.Module] = []
    for _ in range(depth):
        linear = nn.Linear(width, width)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(width, width, generator=gen) / width ** 0.5)
            linear.bias.copy_(torch.randn(width, generator=gen))
        layers += [linear, nn.ReLU()]
    model: nn.Module = nn.Sequential(*layers)
    if scale is not None:
        model = _Scaled(model, scale)
    gm = fx.symbolic_trace(model).eval()
    return gm, [torch.randn(batch, width, generator=gen)]


def child_env(directory: Path, **extra: str) -> dict[str, str]:
    """This environment for a child, with no LTC_CACHE_* but those given
    (and no fused libraries: each would be a background g++ compile)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LTC_CACHE_")}
    return {**env, "LTC_CACHE_DIR": str(directory), "LTC_CACHE_FUSE": "off", **extra}


def matches_eager(gm: fx.GraphModule, compiled, inputs: list[torch.Tensor]) -> bool:
    expected = gm(*inputs)
    got = compiled(*inputs)
    return len(got) == 1 and torch.allclose(got[0], expected, atol=1e-6)


def key_of(name: str) -> str:
    gm, inputs = build(name)
    return compute_key(gm, inputs).digest


# -- files on disk ---------------------------------------------------------

def snapshot(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` -> sha256 of its bytes."""
    files = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and not path.is_symlink():
            files[str(path.relative_to(directory))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return files


def value_file(store: DiskStore, key: str) -> Path | None:
    """The file diskcache keeps ``key``'s value in; None if it is inline."""
    (filename,), = store.cache._sql("SELECT filename FROM Cache WHERE key = ?", (key,))
    return None if filename is None else Path(store.cache.directory) / filename


def flip_bit(path: Path, offset: int, bit: int = 0) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))


def envelope(body: bytes, *, schema: int = SCHEMA_VERSION, **extra: Any) -> bytes:
    """Entry bytes around ``body`` with a checksum that holds: what a writer
    with another idea of the body's shape would produce."""
    return msgpack.packb({"format": FORMAT, "schema": schema,
                          "sha256": hashlib.sha256(body).digest(), "body": body, **extra},
                         use_bin_type=True)


def body_of(data: bytes) -> dict[str, Any]:
    return msgpack.unpackb(msgpack.unpackb(data, raw=False)["body"], raw=False)


def padded(entry: Entry, key: str, size: int, rng: random.Random) -> Entry:
    """A copy of ``entry`` stored under ``key`` and carrying ``size`` bytes
    of metadata: decodes like an entry, and is as large as we like."""
    return dataclasses.replace(entry, key=key,
                               meta={**entry.meta, "padding": rng.randbytes(size)})


@contextmanager
def recorded_warnings() -> Iterator[list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        messages: list[str] = []
        yield messages
    messages.extend(str(w.message) for w in caught if issubclass(w.category, RuntimeWarning))


def decode_all(store: DiskStore) -> tuple[int, list[str]]:
    """Decode every entry in ``store``: (how many, problems)."""
    count, problems = 0, []
    for key in list(store.keys()):
        if not is_entry_key(key):
            continue  # the cache's own records (names of graphs)
        data = store.get(key)
        if data is None:
            continue
        try:
            decode(data, expected_key=key)
            count += 1
        except Exception as exc:
            problems.append(f"{key[:12]}: {type(exc).__name__}: {exc}")
    return count, problems


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
