"""Each warning a user can meet names the setting behind it: the
environment variable to look at or change (an unreachable Redis names
LTC_CACHE_REMOTE, an unusable directory LTC_CACHE_DIR), never a password.
"""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
from torch import fx

from ltc_cache import CacheConfig, GraphCache


def run_once(cache: GraphCache) -> list[str]:
    gm = fx.symbolic_trace(torch.nn.Linear(3, 2))
    x = torch.randn(4, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = cache.extract_compiled_graph(gm, [x])(x)[0]
    torch.testing.assert_close(out, gm(x))  # the model still runs, correct
    return [str(w.message) for w in caught if "ltc_cache" in str(w.message)]


def test_an_unreachable_redis_names_ltc_cache_remote(cache_dir):
    pytest.importorskip("redis")
    # Port 1: nothing listens; the URL's password must not be shown.
    cache = GraphCache(CacheConfig(directory=cache_dir,
                                   remote="redis://:hunter2@127.0.0.1:1/0"))
    messages = run_once(cache)
    remote = [m for m in messages if "remote cache" in m]
    assert len(remote) == 1, messages
    assert "LTC_CACHE_REMOTE" in remote[0] and "127.0.0.1:1/0" in remote[0], remote
    assert "unavailable" in remote[0] and "local cache only" in remote[0]
    assert not any("hunter2" in m for m in messages), messages


def test_a_missing_redis_package_names_ltc_cache_remote(cache_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "redis", None)  # `import redis` now fails
    cache = GraphCache(CacheConfig(directory=cache_dir, remote="redis://127.0.0.1:1/0"))
    (message,) = run_once(cache)
    assert "pip install redis" in message and "LTC_CACHE_REMOTE" in message, message


def test_an_unusable_directory_names_ltc_cache_dir(tmp_path):
    directory = tmp_path / "not-a-directory"
    directory.write_text("a file where the cache directory should be")
    (message,) = run_once(GraphCache(CacheConfig(directory=directory)))
    assert "running uncached" in message, message
    assert "LTC_CACHE_DIR" in message and "LTC_CACHE_DISABLE=1" in message, message
