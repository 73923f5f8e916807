"""Two tiers as one store: a fast local one over a shared remote one.

A read tries the local tier, then the remote one, and copies a remote hit
to the local tier so the next process on this machine reads it from disk. A
write goes to both. The lock is the local one (the processes of a machine
queue on a file) and then the remote one (one machine traces, the others
wait and read what it stored).

The remote tier is best effort. When it fails or is slow, the store carries
on with the local tier alone: one warning, one error counted per failure,
and no further remote calls for ``retry_after`` seconds, so a server that is
down does not cost a timeout on every lookup.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from ..counter_names import ERRORS
from ..diagnostics import count_event, warn_once
from ..errors import LockTimeout
from .base import Store, is_entry_key

__all__ = ["TieredStore"]

logger = logging.getLogger("ltc_cache.store.tiered")

_T = TypeVar("_T")

# Checks bytes read from the remote tier before they are copied to the
# local one; raises EntryError (a ValueError) for bytes that are no good.
Verify = Callable[[str, bytes], object]


class TieredStore(Store):
    """``local`` over ``remote``.

    ``verify(key, data)`` vets a remote hit before it is written through to
    ``local``: a corrupt or tampered entry in the shared tier raises
    EntryError to the cache (a miss that is traced and replaced in both
    tiers) and never lands on the local disk. ``write_through=False`` leaves
    the local tier as it is (a read-only cache directory).
    """

    def __init__(self, local: Store, remote: Store, *, verify: Verify | None = None,
                 write_through: bool = True, retry_after: float = 30.0) -> None:
        self.local = local
        self.remote = remote
        self._verify = verify
        self._write_through = write_through
        self._retry_after = retry_after
        self._down_until = 0.0
        self._down_lock = threading.Lock()
        # Reads the remote tier answered (this store, this process); the
        # process counters count them as hits like any other.
        self.remote_hits = 0
        # Keys whose remote copy failed ``verify``: not fetched again until
        # this process writes a good one (the cache traces and puts next).
        self._rejected: set[str] = set()

    def _remote(self, what: str, fn: Callable[..., _T], *args: object) -> _T | None:
        """Call the remote tier; on failure note it, mark the tier down for
        a while, and return None."""
        if time.monotonic() < self._down_until:
            return None
        try:
            return fn(*args)
        except OSError as exc:  # refused, reset, timed out (TimeoutError is one)
            self._went_down(what, exc)
            return None

    def _went_down(self, what: str, exc: OSError) -> None:
        with self._down_lock:
            self._down_until = time.monotonic() + self._retry_after
        count_event(ERRORS, self.local)
        warn_once("remote", f"remote cache {self.remote!r} unavailable ({what}: {exc}); "
                  f"using the local cache only, trying it again in {self._retry_after:g}s "
                  "(the remote cache is LTC_CACHE_REMOTE; unset it to use the local one "
                  "only)")

    def get(self, key: str) -> bytes | None:
        data = self.local.get(key)
        if data is not None:
            return data
        if key in self._rejected:
            return None
        data = self._remote("read", self.remote.get, key)
        if data is None:
            return None
        # Only entries are vetted as entries; internal records (the op-support
        # record, the per-name key records) have formats of their own, which
        # their readers check.
        if self._verify is not None and is_entry_key(key):
            try:
                self._verify(key, data)
            except Exception:
                # The cache reports it (EntryError: a miss, traced, replaced).
                self._rejected.add(key)
                raise
        with self._down_lock:
            self.remote_hits += 1
        logger.debug("remote hit %s (%d bytes)", key[:12], len(data))
        if self._write_through:
            try:
                self.local.put(key, data)
            except Exception as exc:  # the entry is still good for this process
                count_event(ERRORS, self.local)
                warn_once("write", f"cannot copy a remote entry to the local cache "
                          f"{self.local!r} ({exc}); the local cache is LTC_CACHE_DIR")
        return data

    def put(self, key: str, value: bytes) -> None:
        self._rejected.discard(key)
        try:
            self.local.put(key, value)
        finally:
            self._remote("write", self.remote.put, key, value)

    def delete(self, key: str) -> bool:
        local = self.local.delete(key)
        return bool(self._remote("delete", self.remote.delete, key)) or local

    def keys(self) -> Iterator[str]:
        seen = set(self.local.keys())
        remote = self._remote("list", lambda: list(self.remote.keys())) or []
        return iter([*seen, *(k for k in remote if k not in seen)])

    @contextlib.contextmanager
    def lock(self, key: str, timeout: float) -> Iterator[object]:
        with self.local.lock(key, timeout) as held:
            with contextlib.ExitStack() as taking:
                if time.monotonic() >= self._down_until:
                    try:
                        taking.enter_context(self.remote.lock(key, timeout))
                    except LockTimeout as exc:
                        # Another machine is slow or stuck: trace here too. The
                        # local lock still keeps this machine's processes in line.
                        warn_once("remote-lock-timeout", f"{exc} in the remote cache "
                                  "(LTC_CACHE_REMOTE); tracing on this machine too "
                                  "(LTC_CACHE_LOCK_TIMEOUT sets the wait)")
                    except OSError as exc:
                        self._went_down("lock", exc)
                remote = taking.pop_all()  # released below, quietly
            try:
                yield held
            finally:
                try:
                    remote.close()
                except OSError as exc:  # it expires on its own
                    logger.debug("cannot release the remote lock of %s (%s)", key[:12], exc)

    def record(self, event: str, key: str | None) -> None:
        self.local.record(event, key)

    def close(self) -> None:
        try:
            self.remote.close()
        finally:
            self.local.close()

    def __repr__(self) -> str:
        return f"TieredStore({self.local!r}, {self.remote!r})"
