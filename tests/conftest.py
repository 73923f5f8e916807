"""The tests' fixtures and pytest hooks, and the environment every test
process and child process runs in. What test files share besides fixtures
is in helpers.py."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import RedisServer

from tools.harness import import_path
from zoo import torchvision_ops

# One thread in each test process and child: pytest-xdist already runs a
# worker per core, and the models here are too small to gain from more.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# No fused libraries unless a test asks: each costs 10-30 s of g++, and the
# background worker would compile beside every test (tests/graph/test_fused*.py).
os.environ.setdefault("LTC_CACHE_FUSE", "off")
# Child processes started by path import zoo, tools and helpers as the tests
# do: the repository root and tests/ on their PYTHONPATH (pytest's
# ``pythonpath`` reaches this process only).
os.environ["PYTHONPATH"] = import_path(os.environ.get("PYTHONPATH"))
# torchvision (timm's, from the test extra) importable beside torch's CPU
# build, in this process as tests/sitecustomize.py makes it in the children.
torchvision_ops.install()


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


@pytest.fixture
def stored(captured: dict, cache_dir: Path,
           monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict]:
    """This test's cache: a copy of the test module's ``captured``
    (``captured_models``), under its signing key. The shared models
    directory, and the cold process's report."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(captured["config"]))
    shutil.copytree(captured["cache"], cache_dir)
    return captured["models"], captured["report"]


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
