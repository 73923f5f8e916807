"""A writer killed with SIGKILL at random points while storing loses nothing.

One real trace gives the entries; a server process (torch imported once)
forks writers that store them in a loop, under each key's lock as the cache
does, and each writer is killed after a random delay: while opening the
store, writing a value file, inside SQLite's transaction, or holding the
key's lock. Afterwards every entry decodes, each real key replays correctly
from the cache, and every lock is free.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import warnings
from collections import Counter

import msgpack
import pytest
from helpers import RELIABILITY_CHILD, decode_all, matches_eager, padded

import ltc_cache
from ltc_cache import CacheConfig, GraphCache
from ltc_cache.entries.entry import encode
from ltc_cache.entries.wire import is_entry_key
from ltc_cache.report import verify
from ltc_cache.store import DiskStore
from zoo.reliability_models import build

KILLS = 50
SEED = 20240506


def _read_until(server: subprocess.Popen, *wanted: str) -> dict[str, str]:
    """Read the server's lines until one starting with each of ``wanted``."""
    seen: dict[str, str] = {}
    while set(wanted) - seen.keys():
        line = server.stdout.readline()
        assert line, f"server ended early: {server.stderr.read()}"
        word, rest = line.split(maxsplit=1)
        seen[word] = rest.strip()
    return seen


def _kill_delay(rng: random.Random) -> None:
    # The fault being injected: let the writer run a random while, then kill
    # it. Not synchronisation; the writer announced its start on a pipe.
    # One kill in three comes within 10 ms, while the writer opens the store.
    time.sleep(rng.uniform(0.0, 0.01 if rng.random() < 1 / 3 else 0.15))


@pytest.mark.slow  # 50 writers killed
def test_sigkill_while_storing_loses_nothing(tmp_path):
    directory = tmp_path / "cache"
    rng = random.Random(SEED)

    # One real trace per model: a small entry (inline in SQLite) and a
    # large one (a value file of its own).
    real = {}
    for name in ("mlp2", "deep"):
        gm, inputs = build(name)
        compiled = GraphCache(CacheConfig(directory=directory)).extract_compiled_graph(gm, inputs)
        real[name] = compiled.entry
    payload = {entry.key: encode(entry) for entry in real.values()}
    for i in range(8):
        key = f"{i:064x}"
        size = rng.choice((200, 20_000, 40_000, 300_000))
        payload[key] = encode(padded(real["mlp2"], key, size, rng))
    payload_file = tmp_path / "payload.msgpack"
    payload_file.write_bytes(msgpack.packb(payload, use_bin_type=True))

    server = subprocess.Popen(
        [sys.executable, str(RELIABILITY_CHILD), "crash-server", str(directory), str(payload_file)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    exit_codes: list[int] = []
    landed: Counter[str] = Counter()  # the writer's last step before the kill
    stores_done: list[int] = []
    try:
        for round_ in range(KILLS):
            server.stdin.write(f"fork {SEED + round_}\n")
            server.stdin.flush()
            pid = int(_read_until(server, "forked", "started")["forked"])
            _kill_delay(rng)
            os.kill(pid, signal.SIGKILL)
            server.stdin.write(f"reap {pid}\n")
            server.stdin.flush()
            exit_codes.append(int(_read_until(server, "reaped")["reaped"].split()[1]))
            steps = (tmp_path / f"progress.{pid}").read_text().split()
            landed[steps[-1] if steps else "starting"] += 1
            stores_done.append(steps.count("stored"))
    finally:
        server.stdin.close()  # the server kills any writer still running, then ends
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            raise
    # Every writer was still storing when the kill came.
    assert exit_codes == [-signal.SIGKILL] * KILLS

    store = DiskStore(directory)
    count, problems = decode_all(store)
    assert problems == []
    assert count >= len(real)  # the real entries were stored before any kill
    # And what `ltc-cache verify` checks (checksum, key, the IR parses).
    report = verify(store, filter(is_entry_key, store.keys()))
    assert report.ok and report.checked == count, report.problems
    for key in payload:
        with store.lock(key, timeout=0):  # raises LockTimeout if a dead writer held it
            pass
    # diskcache's own check: the index is sound; a writer killed between
    # writing a value file and committing its row leaves that file behind,
    # unreferenced, which is the only thing it may report.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store.cache.check()
    leftovers = [w for w in caught if not str(w.message).startswith(("unknown file",
                                                                     "empty directory"))]
    assert leftovers == []
    orphans = len(caught) - len(leftovers)
    print(f"{KILLS} kills, landed {dict(landed)} after 0-{max(stores_done)} stores: "
          f"{count} entries decode, {orphans} unreferenced value files")
    # Where they landed depends on the machine's speed; inside a put, always.
    assert landed["storing"] > 0

    before = ltc_cache.stats()
    for name, entry in real.items():
        gm, inputs = build(name)
        compiled = GraphCache(CacheConfig(directory=directory)).extract_compiled_graph(gm, inputs)
        assert compiled.entry.key == entry.key
        assert matches_eager(gm, compiled, inputs)
    after = ltc_cache.stats()
    assert after["hits"] - before["hits"] == len(real)
    assert after["traces"] == before["traces"] and after["errors"] == before["errors"]


@pytest.mark.parametrize("where", ["value file", "transaction"])
def test_a_store_that_fails_midway_leaves_no_value_file(tmp_path, monkeypatch, where):
    """A put that fails after diskcache wrote the value's file (disk full in
    SQLite, a failed commit) takes the file back: nothing else refers to it."""
    import diskcache

    store = DiskStore(tmp_path / "cache")
    if where == "value file":
        def half_write(self, full_path, iterator, mode, encoding=None):
            os.makedirs(os.path.dirname(full_path), exist_ok=True)
            with open(full_path, mode) as f:
                f.write(b"x" * 1000)
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(diskcache.Disk, "_write", half_write)
    else:
        def failing_insert(self, *args):
            import sqlite3

            raise sqlite3.OperationalError("database or disk is full")
        monkeypatch.setattr(diskcache.Cache, "_row_insert", failing_insert)
    with pytest.raises(Exception, match=r"space|full"):
        store.put("a" * 64, b"v" * 100_000)
    files = [p for p in (tmp_path / "cache" / "entries").rglob("*.val")]
    assert files == []
