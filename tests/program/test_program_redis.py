"""``ltc_cache.compile`` programs shared through the Redis tier: only where
the fleet shares ``LTC_CACHE_SECRET``, and never unpickled unsigned."""

from __future__ import annotations

import pickle

import pytest
from helpers import child_env
from test_program import MARKER, Payload, assert_captured, assert_warm, run
from test_program import models as models

from ltc_cache.entries.entry import decode, encode
from ltc_cache.store import RedisStore

SECRET = "fleet-secret-for-tests"


def machine(tmp_path, name: str, url: str, *, secret: bool = True) -> dict[str, str]:
    env = {"LTC_CACHE_DIR": str(tmp_path / name), "LTC_CACHE_REMOTE": url}
    if secret:
        env["LTC_CACHE_SECRET"] = SECRET
    return child_env(**env)


def remote_programs(url: str) -> dict[str, bytes]:
    store = RedisStore(url)
    try:
        found = {}
        for key in list(store.keys()):
            data = store.get(key)
            if len(key) == 64 and decode(data).kind == "program":
                found[key] = data
        return found
    finally:
        store.close()


@pytest.mark.slow
def test_programs_travel_through_redis_with_a_shared_secret(models, redis_server,
                                                             tmp_path):
    url = redis_server.url
    assert_captured(run(models, env=machine(tmp_path, "a", url)))
    (key, data) = next(iter(remote_programs(url).items()))

    # A second machine, empty disk: the program, its graphs and plan come
    # from Redis; nothing is captured or traced.
    assert_warm(run(models, env=machine(tmp_path, "b", url)))

    # Without the fleet's secret a machine never takes a program from Redis
    # (its own key could not have signed it): it captures its own, locally.
    other = run(models, env=machine(tmp_path, "c", url, secret=False))
    assert_captured(other)
    assert remote_programs(url) == {key: data}

    # A program in Redis whose artifact was swapped under a re-signed
    # envelope: its own signature fails, it is never unpickled.
    marker = tmp_path / MARKER
    entry = decode(data)
    program = {**entry.payload, "artifact": pickle.dumps(Payload(str(marker)))}
    forged = type(entry)(entry.key, "", (), (), (), {**entry.meta, "program": program})
    store = RedisStore(url)
    store.put(key, encode(forged, secret=SECRET.encode()))
    store.close()
    poisoned = run(models, env=machine(tmp_path, "d", url))
    assert not marker.exists(), "a poisoned program from Redis was unpickled"
    assert poisoned["max_error"] <= 1e-5, poisoned
    assert poisoned["stats"]["program_captures"] == 1, poisoned
