"""Cache settings, read once from the environment into a frozen value."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .units import parse_size

__all__ = ["CacheConfig", "default_cache_dir"]

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


def default_cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """The per-user cache directory of the platform's convention."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "ltc_cache"
    if sys.platform == "win32":
        base = environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "ltc_cache" / "Cache"
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ltc_cache"


def _flag(environ: Mapping[str, str], name: str) -> bool:
    value = environ.get(name, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name}={value!r}: expected one of 1/0, true/false, yes/no, on/off")


@dataclass(frozen=True)
class CacheConfig:
    """Where the cache lives and how it may be used.

    Every field has an ``LTC_CACHE_*`` variable; see :meth:`from_env`.
    """

    directory: Path
    disable: bool = False
    readonly: bool = False
    # Bytes the entries may take on disk before the least recently used go.
    max_size: int | None = None
    # ``redis://host:port/db`` of a shared tier under the local disk.
    remote: str | None = None
    # Seconds a process waits for another one tracing the same key.
    lock_timeout: float = 600.0
    # Key for HMAC-SHA256 signatures of entries; None leaves them unsigned.
    secret: bytes | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CacheConfig:
        """Read ``LTC_CACHE_DIR``, ``_DISABLE``, ``_READONLY``, ``_MAX_SIZE``,
        ``_REMOTE``, ``_LOCK_TIMEOUT`` and ``_SECRET``."""
        env = os.environ if environ is None else environ
        max_size = env.get("LTC_CACHE_MAX_SIZE")
        secret = env.get("LTC_CACHE_SECRET")
        return cls(
            directory=Path(env.get("LTC_CACHE_DIR") or default_cache_dir(env)).expanduser(),
            disable=_flag(env, "LTC_CACHE_DISABLE"),
            readonly=_flag(env, "LTC_CACHE_READONLY"),
            max_size=parse_size(max_size) if max_size else None,
            remote=env.get("LTC_CACHE_REMOTE") or None,
            lock_timeout=float(env.get("LTC_CACHE_LOCK_TIMEOUT") or 600.0),
            secret=secret.encode() if secret else None,
        )
