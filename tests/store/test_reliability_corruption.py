"""Damaged entries and a damaged index: each is detected, warned about once,
treated as a miss and replaced; never a crash, never a wrong result."""

from __future__ import annotations

import random
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest
import torch
from helpers import (
    body_of,
    delta,
    envelope,
    flip_bit,
    matches_eager,
    recorded_warnings,
    value_file,
)

import ltc_cache
from ltc_cache import CacheConfig, EntryError, GraphCache
from ltc_cache.diagnostics import counters
from ltc_cache.entries.entry import decode
from ltc_cache.entries.wire import SCHEMA_VERSION, is_entry_key
from ltc_cache.store import DiskStore
from zoo.reliability_models import build

# "scaled" stores two constants (inline in SQLite), "deep" is a value file.
NAMES = ("scaled", "mlp2", "deep")


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> dict[str, object]:
    """A cache directory holding every model in NAMES, made once."""
    directory = tmp_path_factory.mktemp("template") / "cache"
    cache = GraphCache(CacheConfig(directory=directory))
    keys = {}
    for name in NAMES:
        gm, inputs = build(name)
        keys[name] = cache.extract_compiled_graph(gm, inputs).entry.key
    cache.store.close()
    return {"directory": directory, "keys": keys}


@pytest.fixture
def copy(template, tmp_path) -> tuple[Path, dict[str, str]]:
    directory = tmp_path / "cache"
    shutil.copytree(template["directory"], directory)
    return directory, template["keys"]


def run(directory: Path, name: str) -> tuple[dict[str, int], list[str]]:
    """Extract ``name`` through a new cache on ``directory`` (as a new process
    would: nothing in memory), check it against eager; the change in the
    counters, and the warnings given."""
    gm, inputs = build(name)
    before = ltc_cache.stats()
    with recorded_warnings() as messages:
        compiled = GraphCache(CacheConfig(directory=directory)).extract_compiled_graph(gm, inputs)
    assert matches_eager(gm, compiled, inputs), "a wrong result"
    return delta(before), messages


def assert_replaced(directory: Path, name: str, key: str) -> None:
    """The entry under ``key`` is good again, and the next process hits it."""
    assert decode(DiskStore(directory).get(key), expected_key=key).key == key
    counters.reset()  # a new process
    delta, messages = run(directory, name)
    assert (delta["hits"], delta["traces"], messages) == (1, 0, [])


def _with_body(change: Callable[[dict], None]) -> Callable[[bytes], bytes]:
    """Corrupt by rewriting the body, then checksumming it afresh: a body of
    the wrong shape that no checksum catches."""
    def corrupt(data: bytes) -> bytes:
        body = body_of(data)
        change(body)
        return envelope(msgpack.packb(body, use_bin_type=True))
    return corrupt


def _const(body: dict) -> list:
    return next(s for s in body["inputs"] if s[0] == "const")[1]


def _flip_in_checksum(data: bytes) -> bytes:
    digest = msgpack.unpackb(data, raw=False)["sha256"]
    at = data.index(digest) + 5
    return data[:at] + bytes([data[at] ^ 1]) + data[at + 1:]


ENTRY_DAMAGE: dict[str, Callable[[bytes], bytes]] = {
    "truncated": lambda d: d[: len(d) // 2],
    "cut by one byte": lambda d: d[:-1],
    "empty": lambda d: b"",
    "zeros": lambda d: bytes(len(d)),
    "flipped byte in the body": lambda d: d[:-40] + bytes([d[-40] ^ 0x10]) + d[-39:],
    "flipped byte in the checksum": _flip_in_checksum,
    "future schema": lambda d: envelope(msgpack.unpackb(d, raw=False)["body"],
                                        schema=SCHEMA_VERSION + 1),
    "past schema": lambda d: envelope(msgpack.unpackb(d, raw=False)["body"], schema=0),
    "envelope is a list": lambda d: msgpack.packb([1, 2, 3]),
    "body is a list": lambda d: envelope(msgpack.packb([1, 2, 3])),
    "body is not bytes": lambda d: msgpack.packb({**msgpack.unpackb(d, raw=False), "body": 7}),
    "body lacks the IR": _with_body(lambda b: b.pop("ir")),
    "IR is a number": _with_body(lambda b: b.update(ir=42)),
    "IR does not parse": _with_body(lambda b: b.update(ir="graph(%x : Tensor):\n  return (%y)")),
    "unknown input kind": _with_body(lambda b: b["inputs"].__setitem__(0, ["pickle", "x"])),
    "input index is text": _with_body(
        lambda b: b["inputs"].__setitem__(b["inputs"].index(["arg", 0]), ["arg", "0"])),
    "constant of no dtype": _with_body(lambda b: _const(b).update(dtype="Tensor")),
    "constant shape over no data": _with_body(
        lambda b: _const(b).update(shape=[1 << 20, 1 << 20], data=b"")),
    "constant data short": _with_body(lambda b: _const(b).update(data=_const(b)["data"][:-1])),
    "one input too few": _with_body(lambda b: b["inputs"].pop()),
    "output index out of range": _with_body(lambda b: b.update(outputs=[["out", 99]])),
    "argument index out of range": _with_body(
        lambda b: b["inputs"].__setitem__(b["inputs"].index(["arg", 0]), ["arg", 5])),
    "update out of range": _with_body(lambda b: b.update(updates=[[99, ["arg", 0]]])),
    "tensor the model lacks": _with_body(
        lambda b: b["inputs"].__setitem__(next(i for i, s in enumerate(b["inputs"])
                                               if s[0] == "attr"), ["attr", "no.such.weight"])),
    "meta is a list": _with_body(lambda b: b.update(meta=[1])),
    "another key's entry": _with_body(lambda b: b.update(key="0" * 64)),
    "written by another torch": _with_body(lambda b: b["meta"].update(torch_version="1.13.0")),
}


@pytest.mark.parametrize("damage", sorted(ENTRY_DAMAGE))
def test_damaged_entry(copy, damage):
    directory, keys = copy
    store = DiskStore(directory)
    store.put(keys["scaled"], ENTRY_DAMAGE[damage](store.get(keys["scaled"])))
    store.close()
    delta, messages = run(directory, "scaled")
    assert (delta["hits"], delta["traces"], delta["stores"]) == (0, 1, 1)
    assert len(messages) == 1 and "traced again" in messages[0], messages
    assert delta["errors"] >= 1
    assert_replaced(directory, "scaled", keys["scaled"])


FILE_DAMAGE: dict[str, Callable[[Path], None]] = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "emptied": lambda p: p.write_bytes(b""),
    "flipped byte": lambda p: flip_bit(p, p.stat().st_size // 2, 3),
    "flipped first byte": lambda p: flip_bit(p, 0, 7),
    "grown": lambda p: p.write_bytes(p.read_bytes() + b"\0" * 100),
}


@pytest.mark.parametrize("damage", sorted(FILE_DAMAGE))
def test_damaged_value_file(copy, damage):
    """The large entry lives in its own file; damage it on disk."""
    directory, keys = copy
    path = value_file(DiskStore(directory), keys["deep"])
    assert path is not None
    FILE_DAMAGE[damage](path)
    delta, messages = run(directory, "deep")
    assert (delta["hits"], delta["traces"], len(messages)) == (0, 1, 1)
    assert_replaced(directory, "deep", keys["deep"])


def test_vanished_value_file_is_a_plain_miss(copy):
    directory, keys = copy
    value_file(DiskStore(directory), keys["deep"]).unlink()
    delta, messages = run(directory, "deep")
    assert (delta["traces"], messages) == (1, [])  # as if deleted: nothing to warn of
    assert_replaced(directory, "deep", keys["deep"])


def test_many_damaged_entries_warn_once(copy):
    directory, keys = copy
    store = DiskStore(directory)
    for name in NAMES:
        store.put(keys[name], b"\x92\x01")
    store.close()
    messages = []
    for name in NAMES:
        delta, given = run(directory, name)
        assert delta["traces"] == 1 and delta["errors"] >= 1
        messages += given
    assert len(messages) == 1


SQLITE_TRIALS = 30


def test_flipped_bits_in_the_sqlite_index(template, tmp_path):
    """Flip 1 to 16 random bits of diskcache's SQLite file, many times.

    Each damage shows as whatever SQLite or diskcache makes of it; whatever
    it is, the model's result is right, every stored value either decodes
    to the entry of its key or is refused as an EntryError, and the next
    process finds the entry.
    """
    rng = random.Random(7)
    seen: Counter[str] = Counter()
    for trial in range(SQLITE_TRIALS):
        directory = tmp_path / f"trial{trial}"
        shutil.copytree(template["directory"], directory)
        db = directory / "entries" / "cache.db"
        size = db.stat().st_size
        for _ in range(rng.choice((1, 4, 16))):
            flip_bit(db, rng.randrange(size), rng.randrange(8))

        counters.reset()  # a new process
        delta, messages = run(directory, "scaled")
        assert len(messages) <= 1, messages
        seen["hit" if delta["hits"] else "detected" if messages else "miss"] += 1

        store = DiskStore(directory)
        for key in list(store.keys()):
            if not is_entry_key(key):
                continue
            try:
                data = store.get(key)
                if data is not None:
                    assert decode(data, expected_key=key).key == key
            except EntryError:
                pass  # refused: a miss for the cache
        store.close()
        # Damage that only this sweep reached replaced the index under the
        # entry the first run stored: the next run stores it again.
        counters.reset()
        run(directory, "scaled")
        assert_replaced(directory, "scaled", template["keys"]["scaled"])
    print(f"{SQLITE_TRIALS} damaged indexes: {dict(seen)}")
    assert seen["detected"] > 0


# -- version skew ------------------------------------------------------------

@pytest.mark.parametrize("skew", ["torch version", "schema"])
def test_entry_of_another_version_is_a_miss_never_loaded(tmp_path, monkeypatch, skew):
    """Written by another torch or another ltc_cache schema: under a key of
    its own (the key hashes both), so this process misses, traces, and
    leaves it alone; copied under this process's key, it is refused."""
    directory = tmp_path / "cache"
    with monkeypatch.context() as patched:
        if skew == "torch version":
            patched.setattr(torch, "__version__", "2.12.0")
        else:
            patched.setattr("ltc_cache.graph.graph_keys.SCHEMA_VERSION", SCHEMA_VERSION + 1)
            patched.setattr("ltc_cache.entries.wire.SCHEMA_VERSION", SCHEMA_VERSION + 1)
        delta, _ = run(directory, "scaled")
        assert delta["stores"] == 1
    store = DiskStore(directory)
    (foreign,) = filter(is_entry_key, store.keys())
    foreign_bytes = store.get(foreign)

    decoded = []
    monkeypatch.setattr("ltc_cache.graph.cache.decode",
                        lambda data, *a, **k: decoded.append(data) or decode(data, *a, **k))
    delta, messages = run(directory, "scaled")
    assert (delta["hits"], delta["traces"], messages) == (0, 1, [])
    assert foreign_bytes not in decoded  # never loaded
    (key,) = set(filter(is_entry_key, store.keys())) - {foreign}
    assert store.get(foreign) == foreign_bytes  # and left alone

    store.put(key, foreign_bytes)
    delta, messages = run(directory, "scaled")
    assert (delta["hits"], delta["traces"], len(messages)) == (0, 1, 1)
    # The schema is read first; another torch's entry is another key's (and,
    # under its own key, "written by another torch" above).
    assert ("stored under" if skew == "torch version"
            else f"schema {SCHEMA_VERSION + 1}") in messages[0]
    assert_replaced(directory, "scaled", key)
