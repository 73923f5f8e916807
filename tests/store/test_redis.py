"""The Redis tier against a real redis-server that each test starts on a free
port (persistence off, data in the test's temp dir) and stops."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import msgpack
import pytest
from helpers import CHILDREN, child_env, delta, free_port, ledger_counts, run_child

import ltc_cache
from ltc_cache import CacheConfig, GraphCache, LockTimeout
from ltc_cache.entries.entry import decode
from ltc_cache.entries.wire import read_envelope
from ltc_cache.graph.graph_keys import compute_key
from ltc_cache.store import DiskStore, RedisStore, TieredStore
from zoo.corner_models import build, check_against_eager, random_inputs

redis = pytest.importorskip("redis", reason="the redis package (test extra) is not installed")
if shutil.which("redis-server") is None:
    pytest.skip("redis-server is not installed (.ci/run installs it)", allow_module_level=True)

KEY = "ab" * 32


def extract_and_check(cache: GraphCache, case: str) -> str:
    gm, shapes = build(case)
    example = random_inputs(shapes, seed=1)
    check_against_eager(gm, cache.extract_compiled_graph(gm, example), shapes)
    return compute_key(gm, example).digest


def remote_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "remote cache" in str(w.message)]


# -- RedisStore ---------------------------------------------------------------------------


def test_store_round_trip_under_its_prefix(redis_server):
    store = RedisStore(redis_server.url)
    other = RedisStore(redis_server.url, prefix="elsewhere:")
    assert store.get(KEY) is None
    store.put(KEY, b"\x00entry bytes\xff")
    other.put("k2", b"x")
    assert store.get(KEY) == b"\x00entry bytes\xff"
    assert list(store.keys()) == [KEY]
    assert list(other.keys()) == ["k2"]
    assert redis_server.client().get(f"ltc_cache:entry:{KEY}") == b"\x00entry bytes\xff"
    assert store.delete(KEY) is True
    assert store.delete(KEY) is False
    assert store.get(KEY) is None and other.get("k2") == b"x"
    assert redis_server.client().pttl(f"ltc_cache:entry:{KEY}") == -2  # gone


def test_ttl_is_set_on_write_and_renewed_on_read(redis_server):
    client = redis_server.client()
    name = f"ltc_cache:entry:{KEY}"
    RedisStore(redis_server.url).put(KEY, b"v")
    assert client.pttl(name) == -1  # no TTL: kept

    store = RedisStore(redis_server.url, ttl=3600)
    store.put(KEY, b"v")
    assert 0 < client.pttl(name) <= 3600_000
    client.pexpire(name, 5000)
    assert store.get(KEY) == b"v"
    assert client.pttl(name) > 5000  # a read renews it


def test_ttl_from_the_environment():
    config = CacheConfig.from_env({"LTC_CACHE_DIR": "/tmp/x", "LTC_CACHE_REMOTE": "redis://h/0",
                                   "LTC_CACHE_REMOTE_TTL": "7d"})
    assert config.remote == "redis://h/0"
    assert config.remote_ttl == 7 * 86400
    assert CacheConfig.from_env({"LTC_CACHE_DIR": "/tmp/x"}).remote_ttl is None


def test_server_failures_are_oserrors(redis_server):
    store = RedisStore(redis_server.url + "?socket_timeout=0.3")
    store.put(KEY, b"v")
    with redis_server.paused(), pytest.raises(TimeoutError, match="timed out"):
        store.get(KEY)
    redis_server.stop()
    with pytest.raises(ConnectionError, match=r"127\.0\.0\.1"):
        store.get(KEY)


def test_lock_is_exclusive_and_released(redis_server):
    a = RedisStore(redis_server.url)
    b = RedisStore(redis_server.url)
    with a.lock(KEY, timeout=1), pytest.raises(LockTimeout), b.lock(KEY, timeout=0.2):
        pass
    with b.lock(KEY, timeout=0.2):  # free again once released
        pass


HOLD_LOCK = """
import sys
from ltc_cache.store import RedisStore
store = RedisStore(sys.argv[1], lock_expiry=float(sys.argv[2]))
with store.lock(sys.argv[3], timeout=30):
    print("held", flush=True)
    sys.stdin.read()
"""


@pytest.mark.slow  # a killed process, and the lock's expiry
def test_lock_of_a_killed_holder_expires(redis_server):
    expiry = 1.0
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, redis_server.url, str(expiry),
                               KEY], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        waiter = RedisStore(redis_server.url, lock_expiry=expiry)
        # A live holder renews its lock: waiting well past the expiry gets nothing.
        with pytest.raises(LockTimeout), waiter.lock(KEY, timeout=3 * expiry):
            pass
        holder.kill()
        holder.wait()
        # Dead, it renews no more: the lock expires and the waiter gets it.
        with waiter.lock(KEY, timeout=20 * expiry):
            assert redis_server.client().exists(f"ltc_cache:lock:{KEY}") == 1
    finally:
        holder.kill()
        holder.wait()


# -- TieredStore --------------------------------------------------------------------------


def test_tiered_reads_through_and_writes_both(redis_server, tmp_path):
    remote = RedisStore(redis_server.url)
    local = DiskStore(tmp_path / "local")
    store = TieredStore(local, remote)
    remote.put(KEY, b"from elsewhere")
    assert store.get(KEY) == b"from elsewhere"
    assert local.get(KEY) == b"from elsewhere"  # written through
    assert store.remote_hits == 1
    store.put("k2", b"new")
    assert remote.get("k2") == b"new" and local.get("k2") == b"new"
    assert sorted(store.keys()) == sorted([KEY, "k2"])
    assert store.delete("k2") and remote.get("k2") is None and local.get("k2") is None


def test_tiered_degrades_to_local_and_comes_back(redis_server, tmp_path):
    remote = RedisStore(redis_server.url)
    local = DiskStore(tmp_path / "local")
    store = TieredStore(local, remote, retry_after=0.0)
    remote.put("only-remote", b"r")
    redis_server.stop()
    before = ltc_cache.stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert store.get("only-remote") is None  # a miss, not an exception
        store.put("k", b"v")
        with store.lock("k", timeout=1):
            pass
        assert list(store.keys()) == ["k"]
    assert local.get("k") == b"v"
    assert len(remote_warnings(caught)) == 1
    assert delta(before)["errors"] == 4  # each failed call counted, warned once

    redis_server.start()  # same port, empty
    assert store.get("k") == b"v"
    store.put("k3", b"w")
    assert remote.get("k3") == b"w"  # the remote tier is used again


# -- GraphCache over Redis ----------------------------------------------------------------


@pytest.mark.slow  # a child process
def test_second_machine_hits_remotely_without_tracing(redis_server, cache_dir, tmp_path):
    cases = ["weighted", "addcmul"]
    # The first machine: this process, its own directory.
    before = ltc_cache.stats()
    first = GraphCache(CacheConfig(directory=tmp_path / "a", remote=redis_server.url))
    keys = {extract_and_check(first, case) for case in cases}
    assert delta(before)["traces"] == 2 and delta(before)["stores"] == 2
    assert keys <= set(RedisStore(redis_server.url).keys())

    second = run_child(*cases, env=child_env(LTC_CACHE_DIR=str(tmp_path / "b"),
                                            LTC_CACHE_REMOTE=redis_server.url))
    assert second["failures"] == {}
    assert second["stats"] == {"hits": 2, "misses": 0, "traces": 0, "stores": 0, "errors": 0}
    assert second["syncs"] == 0 and second["lazy_tensors_created"] == 0
    # The hits were copied to the second machine's disk: it now starts warm alone.
    local_b = DiskStore(tmp_path / "b")
    assert keys <= set(local_b.keys())
    assert all(local_b.get(k) == RedisStore(redis_server.url).get(k) for k in keys)


@pytest.mark.slow  # several processes
def test_machines_starting_together_trace_once(redis_server, cache_dir, tmp_path):
    # Every child waits for EOF on one shared pipe: closing it releases them together.
    release, write_end = os.pipe()
    children = [
        subprocess.Popen(
            [sys.executable, str(CHILDREN / "extract.py"), "weighted",
             "--wait"],
            stdin=release, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=child_env(LTC_CACHE_DIR=str(tmp_path / f"machine{i}"),
                          LTC_CACHE_REMOTE=redis_server.url))
        for i in range(2)
    ]
    os.close(release)
    os.close(write_end)
    reports = []
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["failures"] == {} for r in reports)
    assert sum(r["stats"]["traces"] for r in reports) == 1
    assert sum(r["stats"]["hits"] for r in reports) == 1


def test_redis_stopped_mid_run_keeps_the_model_running(redis_server, cache_dir):
    cache = GraphCache(CacheConfig(directory=cache_dir, remote=redis_server.url))
    first = extract_and_check(cache, "weighted")
    assert first in set(RedisStore(redis_server.url).keys())

    redis_server.stop()
    before = ltc_cache.stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        later = [extract_and_check(cache, case) for case in ("addcmul", "sub")]
    assert len(remote_warnings(caught)) == 1
    stats = delta(before)
    assert stats["traces"] == 2 and stats["stores"] == 2
    assert stats["errors"] == 1  # then the tier rests; no timeout per lookup
    assert ledger_counts(cache_dir)["errors"] == 1  # `ltc-cache stats` counts it too

    # What was traced meanwhile is on the local disk.
    assert {first, *later} <= set(DiskStore(cache_dir).keys())


def test_hanging_redis_costs_a_timeout_not_the_model(redis_server, cache_dir):
    url = redis_server.url + "?socket_timeout=0.5&socket_connect_timeout=0.5"
    cache = GraphCache(CacheConfig(directory=cache_dir, remote=url))
    before = ltc_cache.stats()
    with redis_server.paused(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        extract_and_check(cache, "weighted")
    assert len(remote_warnings(caught)) == 1
    assert "timed out" in remote_warnings(caught)[0]
    assert delta(before)["traces"] == 1 and delta(before)["errors"] == 1


@pytest.mark.slow  # two "machines" in child processes
def test_entry_tampered_in_redis_is_rejected(redis_server, cache_dir, tmp_path):
    key = extract_and_check(GraphCache(CacheConfig(directory=tmp_path / "a",
                                                   remote=redis_server.url)), "weighted")
    client = redis_server.client()
    name = f"ltc_cache:entry:{key}"
    good = client.get(name)
    tampered = bytearray(good)
    at = good.index(b"aten::")  # change an op of the stored IR
    tampered[at:at + 6] = b"aten;;"
    client.set(name, bytes(tampered))

    env_b = child_env(LTC_CACHE_DIR=str(tmp_path / "b"), LTC_CACHE_REMOTE=redis_server.url)
    proc = subprocess.run([sys.executable, str(CHILDREN / "extract.py"),
                           "weighted"], capture_output=True, text=True, env=env_b, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["failures"] == {}  # correct results, from a new trace
    assert report["stats"]["hits"] == 0 and report["stats"]["traces"] == 1
    assert report["stats"]["errors"] == 1
    assert "checksum mismatch" in proc.stderr
    # Replaced in both tiers by a good entry; the tampered bytes never reached the disk.
    for data in (DiskStore(tmp_path / "b").get(key), client.get(name)):
        assert data != bytes(tampered)
        assert decode(data, expected_key=key).key == key


@pytest.mark.slow  # two "machines" in child processes
def test_forged_entry_in_redis_is_rejected_when_entries_are_signed(redis_server, cache_dir,
                                                                   tmp_path):
    secret = b"fleet secret"
    key = extract_and_check(GraphCache(CacheConfig(directory=tmp_path / "a", secret=secret,
                                                   remote=redis_server.url)), "weighted")
    client = redis_server.client()
    name = f"ltc_cache:entry:{key}"
    envelope = msgpack.unpackb(client.get(name))
    assert isinstance(envelope.get("hmac"), bytes)  # signed on the way in
    # Someone who can write to Redis but has no secret: another op, a good checksum.
    body = msgpack.unpackb(envelope["body"])
    assert "aten::relu" in body["ir"]
    body["ir"] = body["ir"].replace("aten::relu", "aten::tanh")
    envelope["body"] = msgpack.packb(body, use_bin_type=True)
    envelope["sha256"] = hashlib.sha256(envelope["body"]).digest()
    forged = msgpack.packb(envelope, use_bin_type=True)
    assert read_envelope(forged)["body"] == envelope["body"]  # the checksum holds
    client.set(name, forged)

    env_b = child_env(LTC_CACHE_DIR=str(tmp_path / "b"), LTC_CACHE_REMOTE=redis_server.url,
                      LTC_CACHE_SECRET=secret.decode())
    proc = subprocess.run([sys.executable, str(CHILDREN / "extract.py"),
                           "weighted"], capture_output=True, text=True, env=env_b, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["failures"] == {}
    assert report["stats"]["traces"] == 1 and report["stats"]["errors"] == 1
    assert "signature mismatch" in proc.stderr
    for data in (DiskStore(tmp_path / "b").get(key), client.get(name)):
        assert decode(data, expected_key=key, secret=secret).ir == body["ir"].replace(
            "aten::tanh", "aten::relu")


def test_readonly_directory_takes_no_write_through(redis_server, cache_dir, tmp_path):
    writer = GraphCache(CacheConfig(directory=tmp_path / "a", remote=redis_server.url))
    key = extract_and_check(writer, "weighted")
    DiskStore(cache_dir).close()  # an empty cache directory, then read-only
    before = ltc_cache.stats()
    reader = GraphCache(CacheConfig(directory=cache_dir, remote=redis_server.url, readonly=True))
    extract_and_check(reader, "weighted")
    assert delta(before)["hits"] == 1 and delta(before)["traces"] == 0
    assert key not in set(DiskStore(cache_dir).keys())


def test_missing_redis_package_is_a_clear_warning(cache_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "redis", None)  # `import redis` now fails
    cache = GraphCache(CacheConfig(directory=cache_dir, remote="redis://127.0.0.1:1/0"))
    before = ltc_cache.stats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        key = extract_and_check(cache, "weighted")
    messages = [str(w.message) for w in caught]
    assert any("pip install redis" in m for m in messages), messages
    assert delta(before)["errors"] == 1 and delta(before)["stores"] == 1
    assert ledger_counts(cache_dir)["errors"] == 1  # `ltc-cache stats` counts it too
    assert key in set(DiskStore(cache_dir).keys())  # the local tier still works


@pytest.mark.slow  # a child process
def test_library_imports_and_runs_without_redis(cache_dir):
    code = ("import sys; sys.modules['redis'] = None\n"
            "import torch, ltc_cache\n"
            "from torch import fx\n"
            "gm = fx.symbolic_trace(torch.nn.Linear(3, 2))\n"
            "x = torch.randn(4, 3)\n"
            "out = ltc_cache.extract_compiled_graph(gm, [x])(x)[0]\n"
            "torch.testing.assert_close(out, gm(x))\n"
            "print(ltc_cache.stats()['stores'])\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=child_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[-1] == "1"


def test_a_remote_url_of_another_scheme_is_refused_clearly(cache_dir):
    cache = GraphCache(CacheConfig(directory=cache_dir, remote="http://127.0.0.1:1/"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        extract_and_check(cache, "weighted")
    assert any("LTC_CACHE_REMOTE='http://127.0.0.1:1/'" in str(w.message) for w in caught)
    assert isinstance(cache.store, DiskStore)


def test_internal_records_come_from_redis_too(redis_server, tmp_path, caplog):
    # A machine warmed from Redis must not probe ops again (issue 14, item 8).
    from ltc_cache.compile_backend.support import (
        OpSupport,
        encode_support_record,
        support_record_key,
    )

    first = GraphCache(CacheConfig(directory=tmp_path / "a", remote=redis_server.url))
    first.store.put(support_record_key(), encode_support_record({"aten.sign.default(float32)": "no",
                                                          "aten.tanh.default(float32)": ""}))
    extract_and_check(first, "weighted")  # and a per-name record
    second = GraphCache(CacheConfig(directory=tmp_path / "b", remote=redis_server.url))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        support = OpSupport(second.store)
        assert "aten.sign.default(float32)" in support.unsupported
    assert support.probes == 0
    assert "op-support" not in caplog.text
    assert ltc_cache.stats()["errors"] == 0
    local = DiskStore(tmp_path / "b")
    assert local.get(support_record_key()) == first.store.get(support_record_key())
    remote_keys = list(RedisStore(redis_server.url).keys())
    names = [k for k in remote_keys if k.startswith("ltc_cache:names:")]
    assert names and all(second.store.get(k) is not None for k in names)


# -- ltc-cache on the Redis tier (issue 14, items 5 and 9) --------------------------------

SCRIPT = Path(sys.executable).with_name("ltc-cache")


def ltc(*args: str, stdin: str = "", **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LTC_CACHE_")}
    environ.update(env)
    return subprocess.run([str(SCRIPT), *args], input=stdin, capture_output=True, text=True,
                          env=environ, timeout=300)


@pytest.mark.slow  # CLI processes that import torch
def test_the_cli_lists_verifies_prunes_and_clears_redis(redis_server, tmp_path):
    url = redis_server.url
    machine = GraphCache(CacheConfig(directory=tmp_path / "a", remote=url))
    keys = {extract_and_check(machine, case) for case in ("weighted", "addcmul")}
    machine.store.close()

    listing = ltc("--remote", url, "ls", "--json")
    assert listing.returncode == 0, listing.stderr
    assert {e["key"] for e in json.loads(listing.stdout)["entries"]} == keys
    stats = json.loads(ltc("stats", "--json", "--remote", url).stdout)
    assert stats["entries"] == 2 and stats["internal_records"] >= 1
    assert ltc("--remote", url, "stats", "--zero").returncode == 2

    # verify, and --fix, on a tampered entry
    tampered = sorted(keys)[0]
    client = redis_server.client()
    data = bytearray(client.get(f"ltc_cache:entry:{tampered}"))
    data[len(data) // 2] ^= 0xFF
    client.set(f"ltc_cache:entry:{tampered}", bytes(data))
    bad = ltc("--remote", url, "verify")
    assert bad.returncode == 1 and f"BAD {tampered[:12]}" in bad.stdout
    fixed = ltc("--remote", url, "verify", "--fix")
    assert fixed.returncode == 0 and "1 removed" in fixed.stdout
    assert client.get(f"ltc_cache:entry:{tampered}") is None

    # prune and clear: the plan, --dry-run, and no deletion without --yes off a terminal
    dry = ltc("--remote", url, "prune", "--max-size", "0", "--dry-run")
    assert dry.returncode == 0 and "Will delete 1 entry," in dry.stdout
    declined = ltc("--remote", url, "clear")
    assert declined.returncode == 1 and "Nothing deleted" in declined.stdout
    assert len(list(RedisStore(url).keys())) > 1

    # With LTC_CACHE_REMOTE set, clear empties both tiers: the next machine traces.
    cleared = ltc("--dir", str(tmp_path / "a"), "clear", "--yes", LTC_CACHE_REMOTE=url)
    assert cleared.returncode == 0, cleared.stderr
    assert "== Redis tier ==" in cleared.stdout
    assert list(RedisStore(url).keys()) == []
    assert list(DiskStore(tmp_path / "a").keys()) == []
    before = ltc_cache.stats()
    extract_and_check(GraphCache(CacheConfig(directory=tmp_path / "b", remote=url)), "weighted")
    assert delta(before)["traces"] == 1


def test_the_cli_says_when_redis_cannot_be_reached(tmp_path):
    proc = ltc("--remote", f"redis://127.0.0.1:{free_port()}/0", "ls")
    assert proc.returncode == 1 and "redis" in proc.stderr.lower()
    assert len(proc.stderr.strip().splitlines()) == 1
    proc = ltc("--remote", "http://example/0", "ls")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
