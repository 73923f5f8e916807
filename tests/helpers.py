"""What the test files and their child processes share: counts since a
point, a cache's ledger, work done once per run, child processes and their
JSON reports, a private redis-server, and the reliability tests' checks of
results and of the store's files. Fixtures and pytest hooks are in
conftest.py; the models in ``zoo``."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    import pytest
    import redis
    import torch
    from torch import fx

    from ltc_cache.entries.entry import Entry
    from ltc_cache.store import DiskStore

# x86 CPU kinds by the vector features the fused tier reads (cpu_isa.FEATURES).
CPU_KINDS: dict[str, frozenset[str]] = {
    "no AVX2": frozenset(),
    "Zen 2 (AVX2)": frozenset({"avx2"}),
    "Skylake-X (AVX-512)": frozenset({"avx2", "avx512"}),
    "Ice Lake, Zen 4 (VNNI)": frozenset({"avx2", "avx512", "avx512_vnni"}),
    "Cooper Lake (VNNI, BF16)": frozenset({"avx2", "avx512", "avx512_vnni", "avx512_bf16"}),
    "Sapphire Rapids (AMX)": frozenset({"avx2", "avx512", "avx512_vnni", "avx512_bf16",
                                        "amx_tile"}),
    "Granite Rapids (AMX FP16)": frozenset({"avx2", "avx512", "avx512_vnni", "avx512_bf16",
                                            "amx_tile", "amx_fp16"}),
}

TESTS = Path(__file__).parent
CHILDREN = TESTS / "children"
RELIABILITY_CHILD = CHILDREN / "reliability.py"


def delta(before: dict[str, int]) -> dict[str, int]:
    """This process's counts since ``before`` (an earlier ``ltc_cache.stats()``)."""
    import ltc_cache

    return {k: v - before.get(k, 0) for k, v in ltc_cache.stats().items()}


def ledger_counts(directory: Path) -> dict[str, int]:
    """The counters ``ltc-cache stats`` shows for ``directory``: every
    process's, from its ledger (read without writing)."""
    from ltc_cache.report import collect_stats
    from ltc_cache.store import open_directory

    store = open_directory(directory, create=False, readonly=True)
    try:
        return dict(collect_stats(store).counters)
    finally:
        store.close()


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str,
                 make: Callable[[Path], dict]) -> tuple[Path, dict]:
    """``make(directory)`` run once for the whole test run, whichever
    pytest-xdist worker needs it first (the others wait for it and read what
    it returned): a cold child process several tests start from, say. The
    directory and ``make``'s JSON-able result; what is in the directory is
    for reading or copying, not changing."""
    import filelock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by the workers of this run
    directory = root / f"once-{name}"
    done = root / f"once-{name}.json"
    with filelock.FileLock(str(root / f"once-{name}.lock")):
        if not done.exists():
            if directory.exists():  # a worker that failed half-way
                shutil.rmtree(directory)
            directory.mkdir()
            done.write_text(json.dumps(make(directory)))
    return directory, json.loads(done.read_text())


def captured_models(tmp_path_factory: pytest.TempPathFactory, name: str,
                    files: dict[str, str], cold: Callable[[Path, dict], dict]) -> dict:
    """Once for the whole run: ``files`` written into a models directory and
    ``cold(models, env)`` run over them, in a cache and under a signing key of
    its own. Its report, the models directory (read only: stored programs
    name its files), the cache (each test copies it: ``stored``) and
    the key's config directory."""

    def capture(root: Path) -> dict:
        models = root / "models"
        models.mkdir()
        for file, text in files.items():
            (models / file).write_text(text)
        env = {k: v for k, v in child_env().items() if not k.startswith("LTC_CACHE_")}
        env.update(LTC_CACHE_DIR=str(root / "ltc"), XDG_CONFIG_HOME=str(root / "config"),
                   LTC_CACHE_FUSE="off")
        return cold(models, env)

    root, report = once_per_run(tmp_path_factory, name, capture)
    return {"report": report, "models": root / "models", "cache": root / "ltc",
            "config": root / "config"}


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child, with ``extra`` set (the
    conftest put the repository root and tests/ on its PYTHONPATH)."""
    env = dict(os.environ)
    env.update(extra)
    return env


def json_child(script: str, *args: str, env: dict[str, str] | None = None,
               timeout: float = 300) -> dict:
    """Run the child script ``tests/children/<script>`` and return the JSON
    report it prints last."""
    proc = subprocess.run([sys.executable, str(CHILDREN / script), *args],
                          capture_output=True, text=True, env=env or child_env(),
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def suite_cold_then_warm(tmp_path_factory: pytest.TempPathFactory, name: str,
                         models: list[str], cold_timeout: float = 900) -> dict:
    """Once for the whole run: tests/children/suite.py over ``models`` in a
    cold process over a new cache directory (the fused tier off), then in a
    warm one; their reports as ``{"cold": ..., "warm": ...}``."""

    def cold_then_warm(directory: Path) -> dict:
        env = {k: v for k, v in child_env().items() if not k.startswith("LTC_CACHE_")}
        env.update(LTC_CACHE_DIR=str(directory / "ltc"), LTC_CACHE_FUSE="off",
                   XDG_CONFIG_HOME=str(directory / "config"))
        cold = json_child("suite.py", *models, env=env, timeout=cold_timeout)
        return {"cold": cold, "warm": json_child("suite.py", *models, env=env, timeout=900)}

    return once_per_run(tmp_path_factory, name, cold_then_warm)[1]


def run_child(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> dict:
    """Run tests/children/extract.py and return its JSON report."""
    return json_child("extract.py", *args, env=env, timeout=timeout)


def relative_error(got: list[float], want: list[float]) -> float:
    """The largest relative difference of two equally long lists (losses)."""
    return max(abs(g - w) / max(abs(w), 1e-12) for g, w in zip(got, want, strict=True))


def on_import_path(env: dict[str, str], directory: Path) -> dict[str, str]:
    """``env`` with ``directory`` first on PYTHONPATH: the child imports the
    modules a test wrote there by name, as a script imports its project's."""
    kept = env.get("PYTHONPATH")
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(directory), kept]))}


# -- a private redis-server (tests/store/test_redis.py) ----------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A private redis-server: free port, its own directory, no persistence."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        import redis

        return redis.Redis.from_url(self.url)

    def start(self) -> None:
        for _ in range(3):  # another program may take the free port first
            self.proc = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                 "--dir", str(self.directory), "--save", "", "--appendonly", "no",
                 "--daemonize", "no"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            log = []
            # The server says when it listens; read its log up to that line.
            for line in self.proc.stdout:
                log.append(line)
                if "Ready to accept connections" in line:
                    threading.Thread(target=self.proc.stdout.read, daemon=True).start()
                    return
            self.proc.wait()
            self.port = free_port()
        raise RuntimeError("redis-server did not start:\n" + "".join(log))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # in case a test paused it
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.proc = None

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The server hangs: connections open, no answers (a slow Redis)."""
        self.proc.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.proc.send_signal(signal.SIGCONT)


# -- the reliability tests (tests/store/test_reliability_*.py) ---------------------------------


def cache_env(directory: Path, **extra: str) -> dict[str, str]:
    """This environment for a child, with no LTC_CACHE_* but those given
    (and no fused libraries: each would be a background g++ compile)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LTC_CACHE_")}
    return {**env, "LTC_CACHE_DIR": str(directory), "LTC_CACHE_FUSE": "off", **extra}


def matches_eager(gm: fx.GraphModule, compiled, inputs: list[torch.Tensor]) -> bool:
    import torch

    expected = gm(*inputs)
    got = compiled(*inputs)
    return len(got) == 1 and torch.allclose(got[0], expected, atol=1e-6)


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


def envelope(body: bytes, *, schema: int | None = None, **extra: Any) -> bytes:
    """Entry bytes around ``body`` with a checksum that holds: what a writer
    with another idea of the body's shape would produce (``schema``: the
    current one unless given)."""
    import msgpack

    from ltc_cache.entries.wire import FORMAT, SCHEMA_VERSION

    return msgpack.packb({"format": FORMAT, "schema": SCHEMA_VERSION if schema is None else schema,
                          "sha256": hashlib.sha256(body).digest(), "body": body, **extra},
                         use_bin_type=True)


def body_of(data: bytes) -> dict[str, Any]:
    import msgpack

    return msgpack.unpackb(msgpack.unpackb(data, raw=False)["body"], raw=False)


def padded(entry: Entry, key: str, size: int, rng: random.Random) -> Entry:
    """A copy of ``entry`` stored under ``key`` and carrying ``size`` bytes
    of metadata: decodes like an entry, and is as large as we like."""
    return dataclasses.replace(entry, key=key,
                               meta={**entry.meta, "padding": rng.randbytes(size)})


def mse_steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
              steps: int = 3) -> list[torch.Tensor]:
    """The (detached) losses of ``steps`` training steps of ``model``, a
    16 -> 4 regression, on seeded random batches of 8."""
    import torch

    losses = []
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return losses


def exit_skipping_teardown() -> NoReturn:
    """End a torchrun rank whose results are written. torch's teardown at
    interpreter exit has hung a rank (faulthandler: the main thread past
    ``main()``, no Python frame below it) in 2 of about 40 launches on a
    loaded machine, so it is skipped."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@contextlib.contextmanager
def ltc_cache_warnings() -> Iterator[list[str]]:
    """The messages of what ltc_cache warns about inside the block (a region
    run eagerly, a graph that does not replay), so a failing test says why."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        messages: list[str] = []
        yield messages
    messages.extend(str(w.message) for w in caught if "ltc_cache" in str(w.message))


@contextlib.contextmanager
def recorded_warnings() -> Iterator[list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        messages: list[str] = []
        yield messages
    messages.extend(str(w.message) for w in caught if issubclass(w.category, RuntimeWarning))


def decode_all(store: DiskStore) -> tuple[int, list[str]]:
    """Decode every entry in ``store``: (how many, problems)."""
    from ltc_cache.entries.entry import decode
    from ltc_cache.entries.wire import is_entry_key

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
