"""What the test files share: fresh counters, a cache directory, child
processes, a private redis-server."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import redis

TESTS = Path(__file__).parent

# One thread in each test process and child: pytest-xdist already runs a
# worker per core, and the models here are too small to gain from more.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# No fused libraries unless a test asks: each costs 10-30 s of g++, and the
# background worker would compile beside every test (tests/graph/test_fused*.py).
os.environ.setdefault("LTC_CACHE_FUSE", "off")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker more than the cores. A slow test's worker
    waits while its child processes start, import torch and exit; a spare
    worker fills those gaps (the whole suite on 2 cores: 17 minutes with
    2 workers, 7 to 9 with 3)."""
    return len(os.sched_getaffinity(0)) + 1


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked slow first, in their order (a stable sort): the
    workers share them out as they free, and the run does not end waiting
    on a long test that began last."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def fresh_process_counters() -> Iterator[None]:
    """Each test sees its own warnings and counts, as a new process would,
    and leaves none to the next."""
    from ltc_cache.diagnostics import counters

    counters.reset()
    yield
    counters.reset()


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


@pytest.fixture
def dynamo_reset():
    """No compiled frame carried in or out of a torch.compile test: each one
    compiles afresh, as a new process would."""
    import torch

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    """A fresh LTC_CACHE_DIR for this test, for this process and its children."""
    directory = tmp_path / "ltc"
    monkeypatch.setenv("LTC_CACHE_DIR", str(directory))
    for name in ("LTC_CACHE_DISABLE", "LTC_CACHE_READONLY", "LTC_CACHE_REMOTE",
                 "LTC_CACHE_SECRET", "LTC_CACHE_MAX_SIZE"):
        monkeypatch.delenv(name, raising=False)
    return directory


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


@pytest.fixture
def stored(captured: dict, cache_dir: Path,
           monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict]:
    """This test's cache: a copy of the test module's ``captured``
    (``captured_models``), under its signing key. The shared models
    directory, and the cold process's report."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(captured["config"]))
    shutil.copytree(captured["cache"], cache_dir)
    return captured["models"], captured["report"]


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env


def json_child(script: str, *args: str, env: dict[str, str] | None = None,
               timeout: float = 300) -> dict:
    """Run the child script ``tests/<script>`` and return the JSON report it
    prints last."""
    proc = subprocess.run([sys.executable, str(TESTS / script), *args],
                          capture_output=True, text=True, env=env or child_env(),
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_child(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> dict:
    """Run tests/child_extract.py and return its JSON report."""
    return json_child("child_extract.py", *args, env=env, timeout=timeout)


def relative_error(got: list[float], want: list[float]) -> float:
    """The largest relative difference of two equally long lists (losses)."""
    return max(abs(g - w) / max(abs(w), 1e-12) for g, w in zip(got, want, strict=True))


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


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (.ci/run installs it)")
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()
