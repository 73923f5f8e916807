from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent


@pytest.fixture(autouse=True)
def fresh_process_counters():
    """Each test sees its own warnings and counts, as a new process would."""
    from ltc_cache.diagnostics import counters

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


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env


def run_child(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> dict:
    """Run tests/child_extract.py and return its JSON report."""
    proc = subprocess.run([sys.executable, str(TESTS / "child_extract.py"), *args],
                          capture_output=True, text=True, env=env or child_env(),
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])
