"""Whoever can write into the cache directory could make this process run
their graph: the directory must be private, stored values are bytes read
from regular files inside it, and with LTC_CACHE_SECRET every entry must
carry a valid HMAC-SHA256 signature."""

from __future__ import annotations

import os
import shutil
import stat
import struct
import time
from pathlib import Path

import diskcache
import msgpack
import pytest
from helpers import (
    body_of,
    delta,
    envelope,
    matches_eager,
    recorded_warnings,
    value_file,
)

import ltc_cache
from ltc_cache import CacheConfig, EntryError, GraphCache
from ltc_cache.entries.entry import decode, encode
from ltc_cache.entries.wire import MAX_ENTRY_BYTES, read_envelope
from ltc_cache.errors import UnsafeDirectory
from ltc_cache.graph.graph_keys import compute_key
from ltc_cache.store import DiskStore
from ltc_cache.store import bundle as bundle_module
from ltc_cache.store import disk as disk_module
from zoo.reliability_models import build

NOBODY = 65534


def run(directory: Path, name: str, **config) -> tuple[dict[str, int], list[str], object]:
    gm, inputs = build(name)
    before = ltc_cache.stats()
    with recorded_warnings() as messages:
        compiled = GraphCache(CacheConfig(directory=directory, **config)) \
            .extract_compiled_graph(gm, inputs)
    assert matches_eager(gm, compiled, inputs), "a wrong result"
    return delta(before), messages, compiled


# -- pickle ----------------------------------------------------------------

class Planted:
    """Unpickling this creates ``marker``: proof that something unpickled it."""

    def __init__(self, marker: Path, size: int) -> None:
        self.marker = marker
        self.padding = b"p" * size

    def __reduce__(self):
        return open, (str(self.marker), "w")


@pytest.mark.parametrize("size", [10, 100_000], ids=["inline", "value file"])
def test_pickled_values_are_refused_never_unpickled(tmp_path, size):
    directory = tmp_path / "cache"
    DiskStore(directory).close()
    gm, inputs = build("mlp2")
    key = compute_key(gm, inputs).digest
    marker = tmp_path / "unpickled"
    # Another program writes into the directory with plain diskcache, which
    # pickles what is not bytes; Planted's pickle (with its padding, when
    # large) lands inline or in a value file.
    planted = diskcache.Cache(str(directory / "entries"))
    planted.set(key, [Planted(marker, size), b"p" * size])
    planted.set(("a", "pickled", "key"), Planted(marker, 10))
    planted.close()

    delta, messages, _ = run(directory, "mlp2")
    assert not marker.exists()
    assert (delta["traces"], len(messages)) == (1, 1)
    assert "not bytes; refused" in messages[0]
    store = DiskStore(directory)
    assert decode(store.get(key), expected_key=key).key == key  # replaced
    keys = list(store.keys())
    assert key in keys and all(isinstance(k, str) for k in keys)
    assert not marker.exists()  # listing skipped the pickled key unread


# -- the directory ---------------------------------------------------------

def test_directory_is_created_private_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        DiskStore(tmp_path / "a" / "b" / "cache").close()
    finally:
        os.umask(old)
    for sub in ("", "entries", "locks"):
        assert stat.S_IMODE((tmp_path / "a" / "b" / "cache" / sub).stat().st_mode) == 0o700


@pytest.mark.parametrize("how", ["owned by nobody", "group-writable", "world-writable",
                                 "entries owned by nobody", "entries is a symlink"])
def test_directory_others_could_write_is_refused(tmp_path, how):
    directory = tmp_path / "cache"
    DiskStore(directory).close()
    if how == "owned by nobody":
        os.chown(directory, NOBODY, NOBODY)
        expected = "belongs to nobody"
    elif how == "group-writable":
        directory.chmod(0o770)
        expected = "writable by group"
    elif how == "world-writable":
        directory.chmod(0o707)
        expected = "writable by others"
    elif how == "entries owned by nobody":
        os.chown(directory / "entries", NOBODY, NOBODY)
        expected = "belongs to nobody"
    else:
        elsewhere = tmp_path / "elsewhere"
        shutil.move(directory / "entries", elsewhere)
        (directory / "entries").symlink_to(elsewhere)
        expected = "is a symlink"
    with pytest.raises(UnsafeDirectory, match=expected):
        DiskStore(directory)
    def state():
        return {p: (s.st_mode, s.st_uid, s.st_size, s.st_mtime_ns)
                for p in [directory, *directory.rglob("*")] for s in [p.lstat()]}

    before = state()
    # The model still runs, uncached, with the reason in one warning.
    delta, messages, _ = run(directory, "mlp1")
    assert (delta["traces"], delta["stores"], len(messages)) == (1, 0, 1)
    assert expected in messages[0] and "running uncached" in messages[0]
    assert state() == before


def test_refusal_message_says_what_to_do(tmp_path):
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o777)
    directory.chmod(0o777)
    with pytest.raises(PermissionError) as caught:
        DiskStore(directory)
    assert f"chmod go-w {directory}" in str(caught.value)
    os.chown(directory, NOBODY, NOBODY)
    directory.chmod(0o700)
    with pytest.raises(PermissionError) as caught:
        DiskStore(directory)
    assert "LTC_CACHE_DIR" in str(caught.value)


# -- symlinks ----------------------------------------------------------------

@pytest.mark.parametrize("link", ["value file", "value directory"])
def test_entries_reached_through_symlinks_are_refused(tmp_path, link):
    directory = tmp_path / "cache"
    run(directory, "deep")  # large: a value file of its own
    gm, inputs = build("deep")
    key = compute_key(gm, inputs).digest
    path = value_file(DiskStore(directory), key)
    outside = tmp_path / "outside"
    outside.mkdir()
    if link == "value file":
        target = outside / "planted.val"
        shutil.move(path, target)
        path.symlink_to(target)
    else:
        target = outside / path.parent.name
        shutil.move(path.parent, target)
        path.parent.symlink_to(target)
    planted = target.read_bytes() if target.is_file() else (target / path.name).read_bytes()

    delta, messages, _ = run(directory, "deep")
    assert (delta["hits"], delta["traces"], len(messages)) == (0, 1, 1)
    assert "symlink; refused" in messages[0]
    assert decode(DiskStore(directory).get(key), expected_key=key).key == key
    # What the link pointed at is untouched (not read, not removed).
    assert (target if target.is_file() else target / path.name).read_bytes() == planted


def test_an_index_that_names_files_outside_is_refused(tmp_path):
    directory = tmp_path / "cache"
    run(directory, "deep")
    store = DiskStore(directory)
    gm, inputs = build("deep")
    key = compute_key(gm, inputs).digest
    (tmp_path / "outside.val").write_bytes(store.get(key))
    store.cache._sql("UPDATE Cache SET filename = ? WHERE key = ?", ("../../outside.val", key))
    store.close()
    delta, messages, _ = run(directory, "deep")
    assert delta["traces"] == 1 and "not one diskcache writes" in messages[0]
    # Replacing the row did not delete the file it named outside.
    assert (tmp_path / "outside.val").exists()


# -- signing -----------------------------------------------------------------

SECRET = "a secret of the deployment"


def _tamper(data: bytes) -> bytes:
    """Change the computation (the model's scale, 2.5 -> 9.5) and checksum the
    body afresh, keeping the old signature: what someone who can write the
    directory, but does not hold the secret, can do."""
    body = body_of(data)
    for source in body["inputs"]:
        if source[0] == "const" and source[1]["dtype"] == "float64":
            source[1]["data"] = struct.pack("d", 9.5)
    old = msgpack.unpackb(data, raw=False)
    return envelope(msgpack.packb(body, use_bin_type=True), hmac=old.get("hmac", b""))


def test_without_a_secret_a_tampered_entry_would_be_trusted(tmp_path):
    """Why signing exists: a checksum alone proves nothing about who wrote."""
    directory = tmp_path / "cache"
    _, _, compiled = run(directory, "scaled")
    store = DiskStore(directory)
    store.put(compiled.entry.key, _tamper(store.get(compiled.entry.key)))
    gm, inputs = build("scaled")
    hit = GraphCache(CacheConfig(directory=directory)).extract_compiled_graph(gm, inputs)
    assert not matches_eager(gm, hit, inputs)


@pytest.mark.parametrize("case", ["unsigned", "tampered", "other secret"])
def test_with_a_secret_only_entries_it_signed_are_used(tmp_path, case):
    directory = tmp_path / "cache"
    secret = SECRET.encode()
    if case == "unsigned":
        _, _, compiled = run(directory, "scaled")
    elif case == "other secret":
        _, _, compiled = run(directory, "scaled", secret=b"another secret")
    else:
        _, _, compiled = run(directory, "scaled", secret=secret)
        store = DiskStore(directory)
        store.put(compiled.entry.key, _tamper(store.get(compiled.entry.key)))
    key = compiled.entry.key

    delta, messages, _ = run(directory, "scaled", secret=secret)  # asserts the result
    assert (delta["hits"], delta["traces"], len(messages)) == (0, 1, 1)
    assert ("unsigned" if case == "unsigned" else "signature mismatch") in messages[0]
    # Replaced by an entry signed with this secret, which the next process uses.
    data = DiskStore(directory).get(key)
    assert decode(data, expected_key=key, secret=secret).key == key
    delta, messages, _ = run(directory, "scaled", secret=secret)
    assert (delta["hits"], messages) == (1, [])


def test_signature_covers_the_body():
    gm, inputs = build("scaled")
    cache = GraphCache(CacheConfig(directory=Path("/nonexistent"), disable=True))
    entry = cache.extract_compiled_graph(gm, inputs).entry
    data = encode(entry, secret=b"k")
    assert read_envelope(data, secret=b"k")["hmac"]
    assert decode(data, secret=b"k").ir == entry.ir
    assert decode(data).ir == entry.ir  # signed entries read without a secret too
    with pytest.raises(EntryError, match="unsigned"):
        decode(encode(entry), secret=b"k")
    with pytest.raises(EntryError, match="signature mismatch"):
        decode(data, secret=b"K")


def test_secret_from_a_file_outside_the_cache(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    env = {"LTC_CACHE_DIR": str(directory), "LTC_CACHE_SECRET_FILE": str(secret_file)}
    config = CacheConfig.from_env(env)
    assert config.secret == SECRET.encode()
    assert SECRET not in repr(config)
    assert CacheConfig.from_env({"LTC_CACHE_DIR": str(directory),
                                 "LTC_CACHE_SECRET": SECRET}).secret == SECRET.encode()


@pytest.mark.parametrize("problem", ["inside the cache", "inside via a symlink", "both set",
                                     "empty", "missing"])
def test_unusable_secret_file_is_refused_clearly(tmp_path, problem):
    directory = tmp_path / "cache"
    directory.mkdir()
    env = {"LTC_CACHE_DIR": str(directory)}
    if problem == "inside the cache":
        (directory / "key").write_text(SECRET)
        env["LTC_CACHE_SECRET_FILE"] = str(directory / "key")
        expected = "inside the cache directory"
    elif problem == "inside via a symlink":
        (directory / "key").write_text(SECRET)
        (tmp_path / "link").symlink_to(directory / "key")
        env["LTC_CACHE_SECRET_FILE"] = str(tmp_path / "link")
        expected = "inside the cache directory"
    elif problem == "both set":
        (tmp_path / "key").write_text(SECRET)
        env |= {"LTC_CACHE_SECRET_FILE": str(tmp_path / "key"), "LTC_CACHE_SECRET": SECRET}
        expected = "not both"
    elif problem == "empty":
        (tmp_path / "key").write_text("\n")
        env["LTC_CACHE_SECRET_FILE"] = str(tmp_path / "key")
        expected = "is empty"
    else:
        env["LTC_CACHE_SECRET_FILE"] = str(tmp_path / "absent")
        expected = "cannot read it"
    # ltc-cache reads the configuration strictly: a usage error that says why.
    with pytest.raises(ValueError, match=expected):
        CacheConfig.from_env(env, strict=True)
    # The library never runs unsigned in its place: the cache is off.
    config = CacheConfig.from_env(env)
    assert config.disable and config.secret is None


# -- bounded decoding ----------------------------------------------------------

@pytest.mark.parametrize("data", [
    b"\xdd\xff\xff\xff\xff",  # an array of 2**32 - 1 items, in 5 bytes
    b"\xdf\xff\xff\xff\xff",  # a map of as many
    b"\xc6\xff\xff\xff\xff",  # a 4 GiB binary
    b"\x91" * 100_000 + b"\xc0",  # nested 100,000 deep
], ids=["array", "map", "bin", "deep"])
def test_msgpack_bombs_are_refused_at_once(data):
    start = time.perf_counter()
    with pytest.raises(EntryError, match="not msgpack"):
        decode(data)
    assert time.perf_counter() - start < 1.0


def test_an_oversized_body_is_refused_before_it_is_read(monkeypatch):
    monkeypatch.setattr("ltc_cache.entries.wire.MAX_ENTRY_BYTES", 1000)
    with pytest.raises(EntryError, match="over the 1000 byte bound"):
        decode(b"\x00" * 1001)


def test_a_constant_must_fit_its_data():
    """A shape is not believed beyond the bytes that back it: no 4 TiB
    allocation from a 100-byte entry."""
    body = {"key": "k", "ir": "", "outputs": [], "updates": [], "meta": {},
            "inputs": [["const", {"dtype": "float32", "shape": [1 << 20, 1 << 20],
                                  "data": b""}]]}
    with pytest.raises(EntryError, match="does not fit"):
        decode(envelope(msgpack.packb(body, use_bin_type=True)))


def test_an_oversized_value_file_is_refused_unread(tmp_path, monkeypatch):
    directory = tmp_path / "cache"
    run(directory, "deep")
    gm, inputs = build("deep")
    key = compute_key(gm, inputs).digest
    monkeypatch.setattr(disk_module, "MAX_ENTRY_BYTES", 1000)
    with pytest.raises(EntryError, match="over the 1000 byte bound"):
        DiskStore(directory).get(key)


def test_store_and_entry_bounds_agree():
    # One bound (store/base.py): the disk tier reads no value past it, and a
    # bundle takes any entry under it.
    assert disk_module.MAX_ENTRY_BYTES == MAX_ENTRY_BYTES
    assert bundle_module._MAX_RECORD_BYTES > MAX_ENTRY_BYTES
