"""Cache settings, read once from the environment into a frozen value."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .units import parse_age, parse_size

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



def _secret(environ: Mapping[str, str], directory: Path) -> bytes | None:
    """The signing key: ``LTC_CACHE_SECRET``, or the contents of the file
    ``LTC_CACHE_SECRET_FILE`` names. A key kept inside the cache directory
    would sign whatever someone who can write there plants, so it is refused."""
    value, path = environ.get("LTC_CACHE_SECRET"), environ.get("LTC_CACHE_SECRET_FILE")
    if value and path:
        raise ValueError("set LTC_CACHE_SECRET or LTC_CACHE_SECRET_FILE, not both")
    if not path:
        return value.encode() if value else None
    secret_file = Path(path).expanduser().resolve()
    if secret_file.is_relative_to(directory.resolve()):
        raise ValueError(f"LTC_CACHE_SECRET_FILE={path} is inside the cache directory "
                         f"{directory}: keep the key where the cache's writers cannot read it")
    try:
        secret = secret_file.read_bytes().strip()
    except OSError as exc:
        raise ValueError(f"LTC_CACHE_SECRET_FILE={path}: cannot read it ({exc})") from None
    if not secret:
        raise ValueError(f"LTC_CACHE_SECRET_FILE={path} is empty")
    return secret

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
    # Seconds an unread entry stays in the remote tier; None keeps it.
    remote_ttl: float | None = None
    # Seconds a process waits for another one tracing the same key.
    lock_timeout: float = 600.0
    # Key for HMAC-SHA256 signatures of entries; None leaves them unsigned.
    # Out of the repr: configurations end up in logs.
    secret: bytes | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CacheConfig:
        """Read ``LTC_CACHE_DIR``, ``_DISABLE``, ``_READONLY``, ``_MAX_SIZE``,
        ``_REMOTE``, ``_REMOTE_TTL``, ``_LOCK_TIMEOUT`` and ``_SECRET`` (or
        ``_SECRET_FILE``)."""
        env = os.environ if environ is None else environ
        max_size = env.get("LTC_CACHE_MAX_SIZE")
        directory = Path(env.get("LTC_CACHE_DIR") or default_cache_dir(env)).expanduser()
        remote_ttl = env.get("LTC_CACHE_REMOTE_TTL")
        return cls(
            directory=directory,
            disable=_flag(env, "LTC_CACHE_DISABLE"),
            readonly=_flag(env, "LTC_CACHE_READONLY"),
            max_size=parse_size(max_size) if max_size else None,
            remote=env.get("LTC_CACHE_REMOTE") or None,
            remote_ttl=parse_age(remote_ttl) if remote_ttl else None,
            lock_timeout=float(env.get("LTC_CACHE_LOCK_TIMEOUT") or 600.0),
            secret=_secret(env, directory),
        )
