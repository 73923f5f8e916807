"""Opening the tiers a configuration names: the cache directory, and the
shared Redis tier over it. The cache and ``ltc-cache`` open a directory
through the same :func:`open_directory`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from ..diagnostics import warn_once
from ..errors import NoCache, UnsafeDirectory
from .base import Store
from .disk import DiskStore
from .readonly import ReadOnlyDiskStore
from .redis import RedisStore  # imports the optional redis package only when made
from .safety import is_write_failure
from .tiered import TieredStore, Verify

if TYPE_CHECKING:
    from ..config import CacheConfig

__all__ = ["Tiers", "open_directory", "open_tiers"]


def open_directory(directory: Path, *, create: bool = False, readonly: bool = False,
                   max_size: int | None = None) -> DiskStore:
    """The cache at ``directory``. Raises NoCache where there is none,
    unless ``create`` (and not ``readonly``): a mistyped path must not read
    as an empty cache. ``readonly`` writes nothing, so it serves a read-only
    mount: a ReadOnlyDiskStore, which is another store rather than a flag
    every method of DiskStore checks."""
    directory = Path(directory)
    if readonly or not create:
        if not directory.is_dir():
            raise NoCache(f"no cache directory at {directory}")
        if not (directory / "entries" / "cache.db").is_file():
            raise NoCache(f"{directory} is not an ltc_cache directory (no entries/cache.db)")
    store = ReadOnlyDiskStore if readonly else DiskStore
    return store(directory, max_size=max_size)


class Tiers(NamedTuple):
    """What :func:`open_tiers` opened."""

    store: Store | None  # None: no cache (disabled, or no usable directory)
    # Nothing is written: LTC_CACHE_READONLY, or a directory found unwritable.
    readonly: bool
    # (topic, message) of each problem met, for the caller to count and warn of
    # once it has the store to count them in.
    errors: tuple[tuple[str, str], ...] = ()


def open_tiers(config: CacheConfig, *, verify: Verify | None = None) -> Tiers:
    """The tiers ``config`` names: its directory (read-only where it cannot
    be written but holds a cache), under the Redis tier of
    ``config.remote``. ``verify`` vets a remote hit before it is copied to
    the directory (see TieredStore)."""
    if config.disable:
        return Tiers(None, config.readonly)
    readonly = config.readonly
    try:
        local = open_directory(config.directory, create=True, readonly=readonly,
                               max_size=config.max_size)
    except Exception as exc:
        local = None if readonly else _read_only_fallback(config.directory, exc)
        if local is None:
            return Tiers(None, readonly, (("open", f"cannot use cache directory "
                                           f"{config.directory} ({exc}); running uncached "
                                           "(the directory is LTC_CACHE_DIR; "
                                           "LTC_CACHE_DISABLE=1 turns the cache off)"),))
        readonly = True
    if not config.remote:
        return Tiers(local, readonly)
    try:
        remote = RedisStore(config.remote, ttl=config.remote_ttl)
    except (ImportError, ValueError) as exc:
        return Tiers(local, readonly, (("remote", f"{exc}; using the local cache only "
                                                  "(the remote cache is LTC_CACHE_REMOTE)"),))
    return Tiers(TieredStore(local, remote, write_through=not readonly, verify=verify), readonly)


def _read_only_fallback(directory: Path, exc: Exception) -> DiskStore | None:
    """A directory this process cannot write (a read-only mount, a full
    disk: diskcache writes as it opens) still serves the entries in it;
    None where it cannot, or where ``exc`` is not about writing."""
    if isinstance(exc, UnsafeDirectory) or not directory.is_dir() \
            or (os.access(directory, os.W_OK) and not is_write_failure(exc)):
        return None
    try:
        local = open_directory(directory, readonly=True)
    except Exception:
        return None
    warn_once("read-only", f"cannot write cache directory {directory} ({exc}); "
              "using the entries in it and storing none (the directory is LTC_CACHE_DIR; "
              "LTC_CACHE_READONLY=1 reads it without this warning)")
    return local
