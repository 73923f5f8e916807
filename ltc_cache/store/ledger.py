"""Counters and listing summaries that outlive a process, kept beside the entries.

``DIR/ledger.db`` is a small SQLite database of its own rather than a table
in diskcache's: its writes on the hit path then never queue behind a large
entry being written, and losing it loses statistics, never an entry. It holds

- ``counters``: hits, misses, traces, stores, errors and evictions of every
  process that used the directory, and the events of its torch.compile
  backends (``diagnostics.LEDGER_EVENTS``; ``ltc-cache stats``);
- ``entries``: per entry key, the hits and last use the cache recorded, and
  the listing summary written when the entry was stored, so ``ltc-cache ls``
  reads a few hundred bytes per entry instead of decoding its body.

Summaries are for display only; ``ltc-cache verify`` is what checks entries.
Nothing here imports torch: listing a cache must not pay for it.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import msgpack

from ..counter_names import HITS

__all__ = ["LEDGER_NAME", "EntryRecord", "Ledger", "summarise_entries_with"]

logger = logging.getLogger("ltc_cache.store.ledger")

LEDGER_NAME = "ledger.db"

# What an entry's listing summary is, given its bytes: the entries layer's
# (ltc_cache/entries/kind_registry.py gives it when imported, as every
# process that makes entries does). Until then an entry is stored without a
# summary, and a listing reads the entry instead.
_summarisers: list[Callable[[bytes], Mapping[str, Any]]] = []


def summarise_entries_with(summarise: Callable[[bytes], Mapping[str, Any]]) -> None:
    """Summarise every entry stored from now on with ``summarise``."""
    _summarisers[:] = [summarise]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS info (name TEXT PRIMARY KEY, value);
CREATE TABLE IF NOT EXISTS entries (
    key TEXT PRIMARY KEY,
    hits INTEGER NOT NULL DEFAULT 0,
    last_used REAL,
    summary BLOB
);
"""


class EntryRecord(NamedTuple):
    hits: int
    last_used: float | None  # when the cache last served it, None if never
    summary: Mapping[str, Any] | None  # None where it was stored without one


class Ledger:
    """One directory's ledger. Safe across threads (a connection each) and
    forks (reconnects in the child), like diskcache itself.

    ``timeout`` bounds the wait for another process's write: a counter is
    not worth stalling a model for, so writers that time out drop theirs.
    """

    def __init__(self, path: Path, *, timeout: float = 1.0) -> None:
        self.path = Path(path)
        self._timeout = timeout
        self._local = threading.local()
        # This process's threads write one at a time: each waits for the
        # others here, not on SQLite's lock, where a wait past ``timeout``
        # drops the count (meant for other processes' writes).
        self._writing = threading.Lock()

    def _connect(self, *, create: bool) -> sqlite3.Connection | None:
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            local.con, local.ro, local.pid = None, None, os.getpid()
        if local.con is not None:
            return local.con
        if not self.path.exists():
            if not create:
                return None
            # Owner-only like the rest of the directory; SQLite gives the
            # -wal and -shm files the mode of the database file.
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        con = sqlite3.connect(self.path, timeout=self._timeout, isolation_level=None)
        try:
            con.execute("PRAGMA synchronous = OFF")  # as the index: no fsync
            if create:
                con.execute("PRAGMA journal_mode = WAL")
                con.executescript(_SCHEMA)
        except sqlite3.Error:
            con.close()
            raise
        local.con = con
        return con

    def _read(self, sql: str) -> list[tuple]:
        """Rows of a query, on a read-only connection: listing a cache on a
        read-only mount must work, and must not write to it."""
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            local.con, local.ro, local.pid = None, None, os.getpid()
        con = local.con or local.ro
        if con is None:
            if not self.path.exists():
                return []
            uri = self.path.resolve().as_uri()
            try:
                con = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=self._timeout)
                con.execute("SELECT 1 FROM counters LIMIT 1").fetchall()
            except sqlite3.OperationalError:
                # WAL readers make a -shm file; where they cannot, no one can
                # be writing either, and ``immutable`` reads without one.
                con = sqlite3.connect(f"{uri}?immutable=1", uri=True)
            local.ro = con
        return con.execute(sql).fetchall()

    # -- writes: the cache's hooks; cheap, and they never raise --

    def record(self, event: str, key: str | None, *, now: float | None = None) -> None:
        """Count ``event``; a hit also bumps the entry's hits and last use.
        One short transaction."""
        try:
            con = self._connect(create=True)
            with self._writing, con:
                con.execute("BEGIN IMMEDIATE")
                con.execute("INSERT INTO counters VALUES (?, 1) "
                            "ON CONFLICT(name) DO UPDATE SET value = value + 1", (event,))
                if event == HITS and key is not None:
                    con.execute("INSERT INTO entries (key, hits, last_used) VALUES (?, 1, ?) "
                                "ON CONFLICT(key) DO UPDATE SET hits = hits + 1, "
                                "last_used = excluded.last_used", (key, now or time.time()))
        except Exception as exc:
            logger.debug("cannot record %s of %s in %s: %s", event, key, self.path, exc)

    def note_put(self, key: str, data: bytes) -> None:
        """Write the listing summary of newly stored bytes; a new entry under
        a known key starts with no hits."""
        try:
            summary = (msgpack.packb(dict(_summarisers[0](data)), use_bin_type=True)
                       if _summarisers else None)
            con = self._connect(create=True)
            with self._writing, con:
                con.execute("BEGIN IMMEDIATE")
                con.execute("INSERT INTO entries (key, hits, last_used, summary) "
                            "VALUES (?, 0, NULL, ?) ON CONFLICT(key) DO UPDATE SET "
                            "hits = 0, last_used = NULL, summary = excluded.summary",
                            (key, summary))
        except Exception as exc:
            logger.debug("cannot note entry %s in %s: %s", key[:12], self.path, exc)

    def add(self, name: str, amount: int) -> None:
        """Add ``amount`` to counter ``name`` (evictions)."""
        if amount <= 0:
            return
        try:
            con = self._connect(create=True)
            with con:
                con.execute("INSERT INTO counters VALUES (?, ?) "
                            "ON CONFLICT(name) DO UPDATE SET value = value + ?",
                            (name, amount, amount))
        except Exception as exc:
            logger.debug("cannot add to %s in %s: %s", name, self.path, exc)

    def note_limit(self, limit: int | None) -> None:
        """Record the size limit the storing process keeps the directory to
        (None: none), so ``ltc-cache stats`` shows it whatever its own shell
        has set."""
        try:
            con = self._connect(create=True)
            with con:
                con.execute("INSERT OR REPLACE INTO info VALUES ('size_limit', ?)", (limit,))
        except Exception as exc:
            logger.debug("cannot note the size limit in %s: %s", self.path, exc)

    # -- maintenance: these raise sqlite3.Error / OSError to the caller --

    def forget(self, keys: Iterable[str]) -> None:
        """Drop the records of deleted entries."""
        con = self._connect(create=False)
        if con is None:
            return
        with con:
            con.execute("BEGIN IMMEDIATE")
            con.executemany("DELETE FROM entries WHERE key = ?", ((k,) for k in keys))

    def zero(self, *, now: float | None = None) -> None:
        """Reset the counters and the entries' hit counts; last-use times
        stay, since pruning by age relies on them."""
        con = self._connect(create=True)
        assert con is not None
        with con:
            con.execute("BEGIN IMMEDIATE")
            con.execute("UPDATE counters SET value = 0")
            con.execute("UPDATE entries SET hits = 0")
            con.execute("INSERT OR REPLACE INTO info VALUES ('zeroed_at', ?)",
                        (now or time.time(),))

    def counters(self) -> dict[str, int]:
        return dict(self._read("SELECT name, value FROM counters"))

    def zeroed_at(self) -> float | None:
        rows = self._read("SELECT value FROM info WHERE name = 'zeroed_at'")
        return float(rows[0][0]) if rows else None

    def size_limit(self) -> tuple[bool, int | None]:
        """(whether a storing process recorded its limit, that limit or None)."""
        rows = self._read("SELECT value FROM info WHERE name = 'size_limit'")
        return (True, None if rows[0][0] is None else int(rows[0][0])) if rows else (False, None)

    def entries(self) -> dict[str, EntryRecord]:
        records = {}
        for key, hits, last_used, summary in self._read(
                "SELECT key, hits, last_used, summary FROM entries"):
            try:
                unpacked = msgpack.unpackb(summary, raw=False) if summary else None
            except Exception:  # a damaged summary: the entry is read instead
                unpacked = None
            records[key] = EntryRecord(hits, last_used, unpacked)
        return records

    def close(self) -> None:
        """Close this thread's connections."""
        if getattr(self._local, "pid", None) == os.getpid():
            for name in ("con", "ro"):
                con = getattr(self._local, name, None)
                if con is not None:
                    con.close()
        self._local.con = self._local.ro = None

    def __repr__(self) -> str:
        return f"Ledger({os.fspath(self.path)!r})"
