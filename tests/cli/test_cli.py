"""`ltc-cache`, driven as a user does: the installed console script in a
subprocess, against cache directories filled by real extractions."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pty
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import child_env, run_child

from ltc_cache import CacheConfig, GraphCache
from ltc_cache.entries.entry import decode, encode
from ltc_cache.entries.wire import is_entry_key
from ltc_cache.errors import AmbiguousKey
from ltc_cache.report import resolve_key, scan
from ltc_cache.store import DiskStore, ReadOnlyDiskStore
from ltc_cache.store.bundle import write_bundle
from ltc_cache.units import format_size
from zoo.corner_models import build, random_inputs

SCRIPT = Path(sys.executable).with_name("ltc-cache")
CASES = ("weighted", "const_scale", "tensor_constant", "addcmul")
DAY = 86400.0


def ltc(directory: Path, *args: str, stdin: str = "", **env: str) -> subprocess.CompletedProcess:
    """Run the console script on ``directory`` (no LTC_CACHE_* from outside)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LTC_CACHE_")}
    environ.update(env)
    return subprocess.run([str(SCRIPT), "--dir", str(directory), *args], input=stdin,
                          capture_output=True, text=True, env=environ, timeout=300)


def ls_json(directory: Path, *args: str) -> dict:
    proc = ltc(directory, "ls", "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def fill(directory: Path, cases=CASES) -> dict[str, str]:
    """Extract each case through a cache at ``directory``; graph name -> key."""
    cache = GraphCache(CacheConfig(directory=directory))
    for case in cases:
        gm, shapes = build(case)
        cache.extract_compiled_graph(gm, random_inputs(shapes, seed=1), name=case)
    store = cache.store
    keys = {decode(store.get(key), expected_key=key).graph_name: key
            for key in entry_keys(store)}
    store.close()
    return keys


def entry_keys(store) -> set[str]:
    return set(filter(is_entry_key, store.keys()))


def hit(directory: Path, case: str) -> None:
    """A lookup of ``case`` by a new cache instance, as a new process makes."""
    cache = GraphCache(CacheConfig(directory=directory))
    gm, shapes = build(case)
    cache.extract_compiled_graph(gm, random_inputs(shapes, seed=1), name=case)
    cache.store.close()


def age(directory: Path, key: str, days: float) -> None:
    """Make an entry look last used ``days`` ago (test set-up: waiting is not an option)."""
    when = time.time() - days * DAY
    for db, sql in ((directory / "entries" / "cache.db",
                     "UPDATE Cache SET access_time = ? WHERE key = ?"),
                    (directory / "ledger.db", "UPDATE entries SET last_used = ? WHERE key = ?")):
        con = sqlite3.connect(db)
        with con:
            con.execute(sql, (when, key))
        con.close()


def put_variant(directory: Path, like: str, tag: str, **meta) -> str:
    """Store a copy of entry ``like`` under a new key, with changed metadata."""
    store = DiskStore(directory)
    entry = decode(store.get(like), expected_key=like)
    key = hashlib.sha256(tag.encode()).hexdigest()
    store.put(key, encode(dataclasses.replace(entry, key=key, meta={**entry.meta, **meta})))
    store.close()
    return key


def put_negative(directory: Path, like: str, tag: str) -> str:
    """Store a negative entry (a graph LTC could not extract) as the cache does."""
    store = DiskStore(directory)
    entry = decode(store.get(like), expected_key=like)
    key = hashlib.sha256(tag.encode()).hexdigest()
    meta = {**entry.meta, "graph_name": tag, "node_count": 0}
    store.put(key, encode(dataclasses.replace(
        entry, key=key, ir="", inputs=(), outputs=(), updates=(), meta=meta, kind="negative",
        payload={"reason": "aten::where.self has no LTC lowering"})))
    store.close()
    return key


def stored_keys(directory: Path) -> set[str]:
    store = DiskStore(directory)
    try:
        return entry_keys(store)
    finally:
        store.close()


@pytest.fixture(scope="module")
def filled(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A cache of four real extractions, ``weighted`` hit twice. Read only."""
    assert SCRIPT.exists(), f"the console script is not installed next to {sys.executable}"
    directory = tmp_path_factory.mktemp("filled") / "ltc"
    keys = fill(directory)
    hit(directory, "weighted")
    hit(directory, "weighted")
    return directory, keys


@pytest.fixture
def cache_copy(filled, tmp_path) -> tuple[Path, dict[str, str]]:
    """A copy of ``filled`` a test may change."""
    directory, keys = filled
    copy = tmp_path / "ltc"
    shutil.copytree(directory, copy)
    return copy, keys


def test_ls_shows_each_entry_with_its_metadata(filled):
    directory, keys = filled
    listing = ls_json(directory)
    rows = {e["graph_name"]: e for e in listing["entries"]}
    assert set(rows) == set(CASES)
    store = ReadOnlyDiskStore(directory)
    for name, key in keys.items():
        data = store.get(key)
        entry = decode(data, expected_key=key)
        assert rows[name]["key"] == key
        assert rows[name]["node_count"] == entry.meta["node_count"] > 0
        assert rows[name]["num_inputs"] == len(entry.inputs)
        assert rows[name]["size"] == len(data)
        assert rows[name]["torch_version"] == entry.meta["torch_version"]
    store.close()
    assert rows["weighted"]["hits"] == 2
    assert rows["const_scale"]["hits"] == 0
    assert listing["total"] == {"entries": 4, "size": sum(r["size"] for r in rows.values()),
                                "hits": 2, "unreadable": 0}

    table = ltc(directory, "ls", "--sort", "size")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["KEY", "NAME", "OPS", "INPUTS", "SIZE", "CREATED", "LAST",
                                "USED", "HITS", "TORCH"]
    by_size = sorted(rows.values(), key=lambda r: -r["size"])
    assert [line.split()[0] for line in lines[1:5]] == [r["key"][:12] for r in by_size]
    assert lines[-1].startswith("4 entries")

    only = ls_json(directory, "--filter", "hits>0", "--filter", "name=weigh*")
    assert [e["graph_name"] for e in only["entries"]] == ["weighted"]


def imported_modules(directory: Path, *args: str) -> set[str]:
    """Top-level modules the console script imports for ``args`` (from its
    ``-X importtime`` log), after checking that the command succeeds."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LTC_CACHE_")}
    proc = subprocess.run([sys.executable, "-X", "importtime", str(SCRIPT), "--dir",
                           str(directory), *args], capture_output=True, text=True,
                          env=environ, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return {line.rsplit("|", 1)[-1].strip().split(".")[0]
            for line in proc.stderr.splitlines() if line.startswith("import time:")}


def test_ls_and_stats_never_import_torch(filled):
    directory, _ = filled
    for args in (["ls"], ["ls", "--json", "--sort", "size", "--filter", "accessed<1d"],
                 ["stats"], ["stats", "--json"]):
        modules = imported_modules(directory, *args)
        assert "ltc_cache" in modules and "msgpack" in modules  # the log is read right
        assert "torch" not in modules, args


@pytest.mark.slow  # verify runs: CLI processes that import torch
def test_verify_imports_torch(filled):
    directory, _ = filled
    # verify parses each entry's IR with torch: the lazy import must still happen.
    assert "torch" in imported_modules(directory, "verify")
    proc = ltc(directory, "verify")
    assert proc.returncode == 0 and "Checked 4 entries: 0 bad." in proc.stdout


def test_a_missing_directory_is_an_error_not_an_empty_listing(tmp_path):
    proc = ltc(tmp_path / "nowhere", "ls")
    assert proc.returncode == 2
    assert str(tmp_path / "nowhere") in proc.stderr and proc.stdout == ""
    (tmp_path / "empty").mkdir()
    proc = ltc(tmp_path / "empty", "stats")
    assert proc.returncode == 2 and "not an ltc_cache directory" in proc.stderr


def test_usage_errors_exit_2_with_a_message(filled):
    directory, _ = filled
    proc = ltc(directory, "ls", "--filter", "colour>3")
    assert proc.returncode == 2 and "colour>3" in proc.stderr
    proc = ltc(directory, "prune")
    assert proc.returncode == 2 and "--max-size" in proc.stderr
    proc = ltc(directory, "show", "f" * 64)
    assert proc.returncode == 2 and "no entry" in proc.stderr


@pytest.mark.slow  # a child process and CLI processes
def test_stats_adds_up_the_counts_of_every_process(tmp_path):
    directory = tmp_path / "ltc"
    fill(directory, ["weighted"])  # this process: a miss, a trace, a store
    child = run_child("weighted", env=child_env(LTC_CACHE_DIR=str(directory)))
    assert child["stats"]["hits"] == 1 and child["stats"]["traces"] == 0

    proc = ltc(directory, "stats", "--json")
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)
    assert {k: stats["counters"][k] for k in ("hits", "misses", "traces", "stores", "errors")} \
        == {"hits": 1, "misses": 1, "traces": 1, "stores": 1, "errors": 0}
    assert stats["hit_rate"] == 0.5
    assert stats["entries"] == 1 and stats["entry_size"] > 0
    assert stats["disk_usage"] >= stats["entry_size"]

    assert ltc(directory, "stats", "--zero").returncode == 0
    human = ltc(directory, "stats")
    assert human.returncode == 0
    assert re.search(r"^Hits +0$", human.stdout, re.M)
    assert re.search(r"^Hit rate +-$", human.stdout, re.M)
    assert "stats --zero" in human.stdout
    (row,) = scan(ReadOnlyDiskStore(directory)).entries
    assert row.hits == 0 and row.last_used > 0  # last use kept: prune --older-than uses it


@pytest.mark.slow  # show runs: a CLI process that imports torch
def test_show_gives_metadata_input_layout_and_ir(filled):
    directory, keys = filled
    key = keys["weighted"]
    proc = ltc(directory, "show", key[:8])
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert key in out and "Name" in out and "weighted" in out
    for attr in ("linear.weight", "linear.bias", "norm.running_mean"):
        assert f"attr {attr}" in out
    assert "arg 0" in out and "In-place updates" in out
    assert "IR:" in out and "graph(" in out and "aten::" in out


def test_a_key_prefix_must_be_unique():
    keys = ["ab" + "0" * 62, "ab" + "1" * 62, "cd" * 32]
    assert resolve_key(keys, "AB0") == keys[0]
    with pytest.raises(AmbiguousKey, match="matches 2 entries"):
        resolve_key(keys, "ab")
    with pytest.raises(KeyError):
        resolve_key(keys, "ef")
    with pytest.raises(ValueError, match="not a key"):
        resolve_key(keys, "xyz")


@pytest.mark.slow  # prune --stale runs: CLI processes that import torch
def test_prune_stale_shows_its_plan_asks_and_deletes(cache_copy):
    directory, keys = cache_copy
    stale = put_variant(directory, keys["const_scale"], "stale", torch_version="1.13.0")

    dry = ltc(directory, "prune", "--stale", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert stale[:12] in dry.stdout and "torch 1.13.0" in dry.stdout
    assert "Will delete 1 entry," in dry.stdout and "nothing deleted" in dry.stdout
    declined = ltc(directory, "prune", "--stale", stdin="n\n")
    assert declined.returncode == 1 and "Nothing deleted" in declined.stdout
    assert stale in stored_keys(directory)

    done = ltc(directory, "prune", "--stale", "--yes")
    assert done.returncode == 0, done.stderr
    assert "Deleted 1 entry," in done.stdout
    assert stored_keys(directory) == set(keys.values())


def test_prune_by_last_use_and_by_size(cache_copy):
    directory, keys = cache_copy
    age(directory, keys["addcmul"], 40)
    age(directory, keys["const_scale"], 2)
    old = ls_json(directory, "--filter", "accessed>30d")
    assert [e["graph_name"] for e in old["entries"]] == ["addcmul"]

    proc = ltc(directory, "prune", "--older-than", "30d", "--yes")
    assert proc.returncode == 0, proc.stderr
    assert stored_keys(directory) == {keys[n] for n in ("weighted", "const_scale",
                                                         "tensor_constant")}

    sizes = {e.graph_name: e.size for e in scan(ReadOnlyDiskStore(directory)).entries}
    # Room for all but one: the least recently used (const_scale) goes.
    limit = sizes["weighted"] + sizes["tensor_constant"]
    proc = ltc(directory, "prune", "--max-size", str(limit), "--yes")
    assert proc.returncode == 0, proc.stderr
    assert "least recently used" in proc.stdout
    assert stored_keys(directory) == {keys["weighted"], keys["tensor_constant"]}


def test_clear_deletes_every_entry_after_asking(cache_copy):
    directory, _ = cache_copy
    store = DiskStore(directory)
    internal = set(store.keys()) - entry_keys(store)
    store.close()
    assert internal and list((directory / "locks").glob("*.lock"))
    proc = ltc(directory, "clear", stdin="y\n")
    assert proc.returncode == 0, proc.stderr
    records = f"{len(internal)} internal record{'s' if len(internal) > 1 else ''}"
    assert f"Will delete 4 entries and {records}" in proc.stdout
    assert f"Deleted 4 entries and {records}" in proc.stdout
    # Issue 14, item 5: a cleared cache starts over: no internal records
    # (stats counted them), no ledger rows, no lock files left behind.
    assert stored_keys(directory) == set()
    store = ReadOnlyDiskStore(directory)
    assert list(store.keys()) == [] and store.ledger.entries() == {}
    store.close()
    assert not list((directory / "locks").glob("*.lock"))
    stats = json.loads(ltc(directory, "stats", "--json").stdout)
    assert stats["entries"] == 0 and stats["internal_records"] == 0


def test_clear_leaves_a_lock_file_a_process_holds(cache_copy):
    import filelock

    directory, keys = cache_copy
    held = directory / "locks" / f"{keys['weighted']}.lock"
    with filelock.FileLock(str(held), timeout=0):
        proc = ltc(directory, "clear", "--yes")
        assert proc.returncode == 0, proc.stderr
        assert held.exists()


@pytest.mark.slow  # verify runs: CLI processes that import torch
def test_verify_finds_bad_entries_and_fix_removes_them(cache_copy):
    directory, keys = cache_copy
    store = DiskStore(directory)
    good = store.get(keys["addcmul"])
    flipped = bytearray(good)
    flipped[len(flipped) // 2] ^= 0xFF
    store.put(keys["addcmul"], bytes(flipped))  # checksum no longer holds
    garbage = hashlib.sha256(b"garbage").hexdigest()
    store.put(garbage, b"not an entry at all")
    store.close()
    bad_ir = put_variant(directory, keys["const_scale"], "bad-ir", graph_name="bad-ir")
    store = DiskStore(directory)
    entry = decode(store.get(bad_ir), expected_key=bad_ir)
    store.put(bad_ir, encode(dataclasses.replace(entry, ir="graph(%x : Tensor):\n  oops\n")))
    store.close()
    negative = put_negative(directory, keys["const_scale"], "masked")  # fine: no IR to parse

    listing = ltc(directory, "ls")
    assert listing.returncode == 0
    assert f"! {garbage[:12]}" in listing.stdout and "unreadable" in listing.stdout
    assert "KIND" in listing.stdout.splitlines()[0]
    (row,) = [line for line in listing.stdout.splitlines() if line.startswith(negative[:12])]
    assert row.split()[1:3] == ["masked", "negative"]

    proc = ltc(directory, "verify")
    assert proc.returncode == 1
    for key in (keys["addcmul"], garbage, bad_ir):
        assert f"BAD {key[:12]}" in proc.stdout
    assert "checksum" in proc.stdout and "IR does not parse" in proc.stdout
    assert "3 bad" in proc.stdout
    assert "\r" not in proc.stderr  # no progress bar when stderr is not a terminal

    signed = ltc(directory, "verify", LTC_CACHE_SECRET="s3cret")
    assert signed.returncode == 1 and "7 bad" in signed.stdout  # none of them is signed

    fixed = ltc(directory, "verify", "--fix")
    assert fixed.returncode == 0 and "Checked 7 entries: 3 bad, 3 removed" in fixed.stdout
    assert stored_keys(directory) == {keys["weighted"], keys["const_scale"],
                                      keys["tensor_constant"], negative}


@pytest.mark.slow  # verify runs: a CLI process that imports torch
def test_progress_bar_on_a_terminal(filled):
    directory, _ = filled
    primary, secondary = pty.openpty()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LTC_CACHE_")}
    proc = subprocess.run([str(SCRIPT), "--dir", str(directory), "verify"],
                          stdout=subprocess.PIPE, stderr=secondary, text=True, env=environ,
                          timeout=300)
    os.close(secondary)
    drawn = b""
    while True:
        try:
            chunk = os.read(primary, 4096)
        except OSError:  # EIO: the other end is closed
            break
        if not chunk:
            break
        drawn += chunk
    os.close(primary)
    assert proc.returncode == 0
    assert b"verifying [" in drawn and b"4/4" in drawn


@pytest.mark.slow  # export, import and verify: three CLI processes that import torch
def test_export_then_import_warms_a_new_directory(filled, tmp_path):
    directory, keys = filled
    bundle = tmp_path / "warm.ltcb"
    proc = ltc(directory, "export", str(bundle))
    assert proc.returncode == 0, proc.stderr
    assert "Exported 4 entries" in proc.stdout

    image = tmp_path / "image"
    proc = ltc(image, "import", str(bundle))
    assert proc.returncode == 0, proc.stderr
    assert "Imported 4 entries" in proc.stdout
    assert stored_keys(image) == set(keys.values())
    # A new process on the imported directory starts warm.
    child = run_child("weighted", "const_scale", env=child_env(LTC_CACHE_DIR=str(image)))
    assert child["failures"] == {}
    assert child["stats"]["hits"] == 2 and child["stats"]["traces"] == 0

    # Each entry is checked before it is added: the tampered one is refused.
    store = ReadOnlyDiskStore(directory)
    good, tampered = store.get(keys["addcmul"]), bytearray(store.get(keys["weighted"]))
    store.close()
    tampered[-5] ^= 0x01
    mixed = tmp_path / "mixed.ltcb"
    write_bundle(mixed, [(keys["addcmul"], good), (keys["weighted"], bytes(tampered))], count=2)
    other = tmp_path / "other"
    proc = ltc(other, "import", str(mixed))
    assert proc.returncode == 1
    assert f"REJECTED {keys['weighted'][:12]}" in proc.stdout
    assert stored_keys(other) == {keys["addcmul"]}

    junk = tmp_path / "junk.ltcb"
    junk.write_bytes(b"\x93not a bundle")
    proc = ltc(other, "import", str(junk))
    assert proc.returncode == 2 and "not an ltc_cache bundle" in proc.stderr


def test_size_limit_evicts_the_least_recently_used(filled, tmp_path):
    directory, keys = filled
    source = ReadOnlyDiskStore(directory)
    template = decode(source.get(keys["weighted"]), expected_key=keys["weighted"])
    sizes = {row.key: row.size for row in source.rows()}
    source.close()

    def variant(i: int) -> tuple[str, bytes]:
        key = hashlib.sha256(f"lru-{i}".encode()).hexdigest()
        return key, encode(dataclasses.replace(template, key=key))

    entries = [variant(i) for i in range(5)]
    size = len(entries[0][1])
    store = DiskStore(tmp_path / "limited", max_size=3 * size + size // 2)
    for key, data in entries[:3]:
        store.put(key, data)
    assert store.get(entries[0][0]) is not None  # entry 0 is now the most recently used
    store.put(*entries[3])
    assert set(store.keys()) == {entries[i][0] for i in (0, 2, 3)}  # 1 went, and only 1
    store.put(*entries[4])
    assert set(store.keys()) == {entries[i][0] for i in (0, 3, 4)}
    assert store.ledger.counters()["evictions"] == 2
    store.close()

    # LTC_CACHE_MAX_SIZE reaches the store the cache opens: room for one of
    # the two entries, so storing the second evicts the first.
    limited = tmp_path / "from_env"
    both = sizes[keys["weighted"]] + sizes[keys["const_scale"]]
    config = CacheConfig.from_env({"LTC_CACHE_DIR": str(limited), "LTC_CACHE_FUSE": "off",
                                   "LTC_CACHE_MAX_SIZE": str(both - 1)})
    cache = GraphCache(config)
    for case in ("weighted", "const_scale"):
        gm, shapes = build(case)
        cache.extract_compiled_graph(gm, random_inputs(shapes, seed=1), name=case)
    assert entry_keys(cache.store) == {keys["const_scale"]}
    cache.store.close()


def test_record_never_raises_and_put_still_stores(tmp_path):
    directory = tmp_path / "ltc"
    store = DiskStore(directory)
    (directory / "ledger.db").mkdir()  # SQLite cannot open a directory
    store.record("hits", "a" * 64)
    store.record("errors", None)
    store.put("b" * 64, b"bytes")
    assert store.get("b" * 64) == b"bytes"
    store.close()


def test_the_size_limit_is_recorded_in_the_directory_and_counts_entries_only(filled, tmp_path):
    # Issue 14, item 6: stats shows the limit the directory is kept to, even
    # from a shell without LTC_CACHE_MAX_SIZE; internal records (the names
    # records) do not count toward it, so a limit just above the entries'
    # total evicts nothing.
    directory, keys = filled
    source = ReadOnlyDiskStore(directory)
    entry_total = sum(row.size for row in source.rows() if is_entry_key(row.key))
    source.close()
    limited = tmp_path / "limited"
    limit = entry_total + 10
    cache = GraphCache(CacheConfig(directory=limited, max_size=limit))
    for case in CASES:
        gm, shapes = build(case)
        cache.extract_compiled_graph(gm, random_inputs(shapes, seed=1), name=case)
    cache.store.close()
    assert stored_keys(limited) == set(keys.values())
    stats = json.loads(ltc(limited, "stats", "--json").stdout)
    assert stats["size_limit"] == limit and stats["size_limit_source"] == "recorded"
    assert stats["counters"]["evictions"] == 0
    assert format_size(limit) in ltc(limited, "stats").stdout


@pytest.mark.slow  # show runs: a CLI process that imports torch
def test_global_options_work_after_the_command(filled):
    # Issue 14, item 10.
    directory, keys = filled
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LTC_CACHE_")}
    for argv in (["show", keys["weighted"][:10], "--dir", str(directory), "--no-ir"],
                 ["ls", "--dir", str(directory)], ["stats", "--json", "--dir", str(directory)]):
        proc = subprocess.run([str(SCRIPT), *argv], capture_output=True, text=True,
                              env=environ, timeout=300)
        assert proc.returncode == 0, (argv, proc.stderr)
        assert "entries" in proc.stdout or keys["weighted"] in proc.stdout


def test_usage_errors_are_one_line(filled, tmp_path):
    directory, _ = filled
    for args in (["ls", "--bogus"], ["prune", "--max-size", "10Mb"], ["frobnicate"]):
        proc = ltc(directory, *args)
        assert proc.returncode == 2 and proc.stdout == "", args
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "powers of 1000" in ltc(directory, "prune", "--max-size", "10K").stderr
    assert "powers of 1000" in ltc(directory, "--help").stdout  # the rule, in --help


def test_export_refuses_a_directory_and_overwrites_only_with_force(filled, tmp_path):
    # Issue 14, item 11.
    directory, _ = filled
    proc = ltc(directory, "export", str(tmp_path))
    assert proc.returncode == 2 and "is a directory" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    bundle = tmp_path / "warm.ltcb"
    bundle.write_bytes(b"precious")
    proc = ltc(directory, "export", str(bundle))
    assert proc.returncode == 2 and "--force" in proc.stderr
    assert bundle.read_bytes() == b"precious"
    proc = ltc(directory, "export", str(bundle), "--force", "--key",
               next(iter(filled[1].values()))[:12])
    assert proc.returncode == 0, proc.stderr
    assert "Exported 1 entry (" in proc.stdout  # item 14: the count, in English
    assert bundle.read_bytes() != b"precious"


def test_directory_errors_say_what_is_wrong(tmp_path):
    # Issue 14, item 12.
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    proc = ltc(a_file, "ls")
    assert proc.returncode == 2 and "is not a directory" in proc.stderr
    proc = ltc(tmp_path / "missing", "ls")
    assert proc.returncode == 2 and "no cache directory" in proc.stderr
    assert "LTC_CACHE_DIR" not in proc.stderr  # --dir was given: no hint to set it
    proc = subprocess.run([str(SCRIPT), "--dir", "", "ls"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and "--dir is empty" in proc.stderr


@pytest.mark.slow  # show runs: CLI processes that import torch
def test_show_says_what_a_negative_entry_and_a_plan_are(cache_copy):
    # Issue 14, item 14: no empty Inputs, Outputs and IR sections.
    directory, keys = cache_copy
    negative = put_negative(directory, keys["weighted"], "unextractable")
    proc = ltc(directory, "show", negative[:12])
    assert proc.returncode == 0, proc.stderr
    assert "A negative entry" in proc.stdout and "has no LTC lowering" in proc.stdout
    assert "Inputs (" not in proc.stdout and "IR:" not in proc.stdout
