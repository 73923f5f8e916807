"""What the disk tier relies on in diskcache beyond its public API.

The exact LRU size limit, listing and ``peek`` query diskcache's index table
through its private ``Cache._sql``; the read-only store opens that table
itself; ``BytesOnlyDisk`` overrides ``Disk`` methods by their signatures.
pyproject pins the diskcache versions these were tested with; a release that
changes any of them fails here, by name, rather than somewhere in a model.
"""

from __future__ import annotations

import inspect

import diskcache
import pytest

from ltc_cache.store import DiskStore
from ltc_cache.store.safety import value_file_problem

INLINE, IN_FILE = "a" * 64, "b" * 64


@pytest.fixture
def store(tmp_path):
    store = DiskStore(tmp_path / "cache")
    store.put(INLINE, b"x" * 10)
    store.put(IN_FILE, b"y" * 200_000)
    yield store
    store.close()


def test_the_index_table_has_the_columns_the_store_reads(store):
    assert diskcache.core.DBNAME == "cache.db"  # store/readonly.py, report/listing.py
    columns = {row[1] for row in store.cache._sql("PRAGMA table_info(Cache)").fetchall()}
    assert {"key", "raw", "store_time", "expire_time", "access_time", "size", "mode",
            "filename", "value"} <= columns


def test_a_value_file_has_a_name_the_safety_checks_accept(store):
    (inline, _), (in_file, size) = store.cache._sql(
        "SELECT filename, size FROM Cache WHERE key IN (?, ?) ORDER BY key",
        (INLINE, IN_FILE)).fetchall()
    assert inline is None
    assert value_file_problem(store.cache.directory, in_file) is None
    assert size == 200_000
    assert {row.key: row.size for row in store.rows()} == {INLINE: 10, IN_FILE: 200_000}


def test_a_get_updates_the_access_time_and_a_peek_does_not(store):
    def accessed() -> float:
        return {row.key: row.accessed for row in store.rows()}[INLINE]

    store.cache._sql("UPDATE Cache SET access_time = 0 WHERE key = ?", (INLINE,))
    assert store.peek(INLINE) == b"x" * 10
    assert accessed() == 0
    assert store.get(INLINE) == b"x" * 10
    assert accessed() > 0


def test_the_disk_methods_bytes_only_disk_overrides_keep_their_signatures():
    expected = {
        "store": ["self", "value", "read", "key"],
        "fetch": ["self", "mode", "filename", "value", "read"],
        "get": ["self", "key", "raw"],
        "remove": ["self", "file_path"],
        "_write": ["self", "full_path", "iterator", "mode", "encoding"],
    }
    for name, parameters in expected.items():
        assert list(inspect.signature(getattr(diskcache.Disk, name)).parameters) == parameters, \
            name
    assert isinstance(inspect.getattr_static(diskcache.Cache, "_sql"), property)
