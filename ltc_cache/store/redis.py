"""A Redis tier: entries shared by every machine that can reach one server.

Keys live under a prefix (``ltc_cache:entry:<key>``, ``ltc_cache:lock:<key>``),
so one database can hold other data too. Values are the entry bytes as the
disk tier holds them: checksum and signature travel inside.

The ``redis`` package is optional (``pip install redis``): it is
imported when a RedisStore is made, never when ltc_cache is.

Failures of the server (refused, reset, timed out) surface as the builtin
ConnectionError or TimeoutError, both OSError, as the Store interface asks;
the tier above decides to carry on without Redis.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from ..errors import BadArgument, LockTimeout, MissingDependency, StoreTimeout, StoreUnreachable
from .base import Store

__all__ = ["DEFAULT_PREFIX", "RedisStore"]

logger = logging.getLogger("ltc_cache.store.redis")

DEFAULT_PREFIX = "ltc_cache:"

_T = TypeVar("_T")


def _import_redis() -> Any:
    try:
        import redis
    except ImportError:
        raise MissingDependency(
            "LTC_CACHE_REMOTE names a Redis server but the Python package 'redis' is not "
            "installed; install it with: pip install redis (in ltc_cache's checkout: "
            "pip install -e '.[redis]')"
        ) from None
    return redis


class RedisStore(Store):
    """Entries in Redis under ``prefix``.

    ``ttl`` (seconds) expires an entry that no process has read for that
    long; each read renews it (GETEX: Redis 6.2 or later). Socket timeouts are short because a slow
    Redis must cost a warm start little: the disk tier and a retrace are
    always there. URL query parameters (``?socket_timeout=5``) override them.

    ``lock_expiry`` bounds how long a crashed holder blocks the others; a live
    holder renews its lock every third of that while it traces.
    """

    def __init__(self, url: str, *, prefix: str = DEFAULT_PREFIX, ttl: float | None = None,
                 socket_timeout: float = 2.0, connect_timeout: float = 1.0,
                 lock_expiry: float = 30.0) -> None:
        redis = _import_redis()
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.url = url
        self.prefix = prefix
        self.ttl = ttl
        self.lock_expiry = lock_expiry
        self._errors = redis.RedisError
        self._timeout_error = redis.TimeoutError
        self._not_owned = redis.exceptions.LockError
        # One immediate retry on a dropped connection (a restarted server
        # leaves stale pooled sockets); none on a timeout, which would only
        # double the wait on a server that hangs.
        retry = Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))
        try:
            self._client = redis.Redis.from_url(
                url, socket_timeout=socket_timeout, socket_connect_timeout=connect_timeout,
                retry=retry)
        except ValueError as exc:  # redis-py's message names the accepted schemes
            raise BadArgument(f"LTC_CACHE_REMOTE={url!r}: {exc}") from None

    def _entry(self, key: str) -> str:
        return f"{self.prefix}entry:{key}"

    def _call(self, what: str, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """Run one client call; server failures become builtin OSErrors."""
        try:
            return fn(*args, **kwargs)
        except self._timeout_error as exc:
            raise StoreTimeout(f"redis {self._where()}: {what} timed out ({exc})") from None
        except self._errors as exc:
            raise StoreUnreachable(f"redis {self._where()}: {what} failed ({exc})") from None

    def _where(self) -> str:
        # Never the URL itself: it may hold a password.
        kwargs = self._client.connection_pool.connection_kwargs
        place = kwargs.get("path") or f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"
        return f"{place}/{kwargs.get('db', 0)}"

    def get(self, key: str) -> bytes | None:
        if self.ttl is not None:
            # GETEX (Redis 6.2+) renews the TTL as it reads: entries in use stay.
            return self._call("read", self._client.getex, self._entry(key),
                              px=int(self.ttl * 1000))
        return self._call("read", self._client.get, self._entry(key))

    def put(self, key: str, value: bytes) -> None:
        px = int(self.ttl * 1000) if self.ttl is not None else None
        self._call("write", self._client.set, self._entry(key), bytes(value), px=px)

    def delete(self, key: str) -> bool:
        return bool(self._call("delete", self._client.delete, self._entry(key)))

    def keys(self) -> Iterator[str]:
        start = len(self._entry(""))
        names = self._call("list", lambda: list(
            self._client.scan_iter(match=self._entry("*"), count=1000)))
        return iter(name.decode()[start:] for name in names)

    # -- for ltc-cache: listing, reading without renewing, deleting many --

    def sizes_and_idle(self, keys: list[str]) -> list[tuple[int, float | None]]:
        """(bytes, seconds since last read or None where Redis does not
        track it) of each key, in one round trip. Reads no value and renews
        no TTL."""
        def query() -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            for key in keys:
                pipe.strlen(self._entry(key))
                pipe.object("idletime", self._entry(key))
            return pipe.execute(raise_on_error=False)

        answers = self._call("list", query) if keys else []
        return [(int(size) if isinstance(size, int) else 0,
                 float(idle) if isinstance(idle, int) else None)
                for size, idle in zip(answers[::2], answers[1::2], strict=True)]

    def peek(self, key: str) -> bytes | None:
        """``get`` that leaves the TTL alone (listing or verifying is not use)."""
        return self._call("read", self._client.get, self._entry(key))

    def discard(self, keys: list[str]) -> list[str]:
        """Delete ``keys``; returns those that were there."""
        def delete() -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            for key in keys:
                pipe.delete(self._entry(key))
            return pipe.execute()

        answers = self._call("delete", delete) if keys else []
        return [key for key, gone in zip(keys, answers, strict=True) if gone]

    def where(self) -> str:
        """``host:port/db`` (or the socket path): never the URL, which may hold a password."""
        return self._where()

    @contextlib.contextmanager
    def lock(self, key: str, timeout: float) -> Iterator[object]:
        """Hold ``key`` against every process sharing this Redis, waiting at
        most ``timeout`` seconds. The lock expires ``lock_expiry`` seconds
        after its holder stops renewing it (a crash, SIGKILL, a lost network)."""
        lock = self._client.lock(f"{self.prefix}lock:{key}", timeout=self.lock_expiry,
                                 sleep=min(0.05, self.lock_expiry / 10),
                                 blocking_timeout=timeout, thread_local=False)
        if not self._call("lock", lock.acquire):
            raise LockTimeout(key, timeout)
        stop = threading.Event()
        renewer = threading.Thread(target=self._renew, args=(lock, key, stop),
                                   name=f"ltc_cache-lock-{key[:12]}", daemon=True)
        renewer.start()
        try:
            yield lock
        finally:
            stop.set()
            renewer.join()
            try:
                lock.release()
            except self._not_owned:
                # It expired (the trace outlasted a failed renewal) and maybe
                # went to another process; that one holds it now.
                logger.debug("lock of %s had expired before release", key[:12])
            except self._errors as exc:
                logger.debug("cannot release the lock of %s (%s); it will expire",
                             key[:12], exc)

    def _renew(self, lock: Any, key: str, stop: threading.Event) -> None:
        while not stop.wait(self.lock_expiry / 3):
            try:
                lock.reacquire()
            except self._errors as exc:
                logger.debug("cannot renew the lock of %s (%s)", key[:12], exc)
                return

    def close(self) -> None:
        self._client.close()

    def __repr__(self) -> str:
        return f"RedisStore({self._where()!r}, prefix={self.prefix!r})"
