"""Cache settings, read once from the environment into a frozen value."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from .errors import BadArgument
from .units import parse_age, parse_size

__all__ = ["CacheConfig", "default_cache_dir"]

_T = TypeVar("_T")

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


def _flag(text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise BadArgument("expected one of 1/0, true/false, yes/no, on/off")


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise BadArgument("not a number of seconds") from None


def _positive(parse: Callable[[str], float]) -> Callable[[str], float]:
    def positive(text: str) -> float:
        value = parse(text)
        if not math.isfinite(value) or value <= 0:
            raise BadArgument("must be a positive, finite number")
        return value
    return positive


# LTC_CACHE_FUSE: how a stored graph gets its fused library (graph/fused/tier.py).
FUSE_MODES = ("background", "sync", "off")


def _fuse_mode(text: str) -> str:
    mode = text.strip().lower()
    if mode not in FUSE_MODES:
        raise BadArgument(f"expected one of {', '.join(FUSE_MODES)}")
    return mode


def _size_limit(text: str) -> int:
    # 0 would evict every entry as it is stored; no limit is the variable unset.
    limit = parse_size(text)
    if limit <= 0:
        raise BadArgument("a limit of 0 bytes keeps nothing (unset it for no limit)")
    return limit


def _secret(environ: Mapping[str, str], directory: Path) -> bytes | None:
    """The signing key: ``LTC_CACHE_SECRET``, or the contents of the file
    ``LTC_CACHE_SECRET_FILE`` names. A key kept inside the cache directory
    would sign whatever someone who can write there plants, so it is refused."""
    value, path = environ.get("LTC_CACHE_SECRET"), environ.get("LTC_CACHE_SECRET_FILE")
    if value and path:
        raise BadArgument("set LTC_CACHE_SECRET or LTC_CACHE_SECRET_FILE, not both")
    if not path:
        return value.encode() if value else None
    secret_file = Path(path).expanduser().resolve()
    if secret_file.is_relative_to(directory.resolve()):
        raise BadArgument(f"LTC_CACHE_SECRET_FILE={path} is inside the cache directory "
                         f"{directory}: keep the key where the cache's writers cannot read it")
    try:
        secret = secret_file.read_bytes().strip()
    except OSError as exc:
        raise BadArgument(f"LTC_CACHE_SECRET_FILE={path}: cannot read it ({exc})") from None
    if not secret:
        raise BadArgument(f"LTC_CACHE_SECRET_FILE={path} is empty")
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
    # How stored graphs get their fused libraries: compiled by a background
    # worker (LTC_CACHE_FUSE's default), in the calling process (``sync``),
    # or not at all. A configuration built in code fuses where it says so.
    fuse: str = "off"
    # Seconds one library's compile may take before it is refused.
    fuse_timeout: float = 900.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *,
                 strict: bool = False) -> CacheConfig:
        """Read ``LTC_CACHE_DIR``, ``_DISABLE``, ``_READONLY``, ``_MAX_SIZE``,
        ``_REMOTE``, ``_REMOTE_TTL``, ``_LOCK_TIMEOUT``, ``_SECRET`` (or
        ``_SECRET_FILE``), ``_FUSE`` and ``_FUSE_TIMEOUT``.

        A malformed value never breaks the user's model: it warns once,
        naming the variable and what was used instead (the default; for a
        secret that cannot be used, no cache at all, since running unsigned
        would trust what the secret was meant to refuse). ``strict`` raises
        ValueError instead (``ltc-cache``: a usage error)."""
        env = os.environ if environ is None else environ

        def setting(name: str, read: Callable[[str], _T], fallback: _T, said: str) -> _T:
            text = env.get(name, "")
            if not text.strip():
                return fallback
            try:
                return read(text)
            except ValueError as exc:
                if strict:
                    raise BadArgument(f"{name}={text!r}: {exc}") from None
                _bad_setting(name, text, exc, said)
                return fallback

        disable = setting("LTC_CACHE_DISABLE", _flag, False, "the cache stays on")
        try:
            directory = Path(env.get("LTC_CACHE_DIR") or default_cache_dir(env)).expanduser()
        except RuntimeError as exc:  # no home directory to put the default in, nor ~ to expand
            if strict:
                raise BadArgument(f"LTC_CACHE_DIR: {exc}") from None
            _bad_setting("LTC_CACHE_DIR", env.get("LTC_CACHE_DIR", ""), ValueError(str(exc)),
                         "the cache is off (LTC_CACHE_DISABLE=1)")
            directory, disable = Path(), True
        try:
            secret = _secret(env, directory)
        except ValueError as exc:
            if strict:
                raise
            _bad_setting("LTC_CACHE_SECRET", "", exc, "the cache is off (LTC_CACHE_DISABLE=1)")
            secret, disable = None, True
        return cls(
            directory=directory,
            disable=disable,
            readonly=setting("LTC_CACHE_READONLY", _flag, False, "read and write"),
            max_size=setting("LTC_CACHE_MAX_SIZE", _size_limit, None, "no size limit"),
            remote=env.get("LTC_CACHE_REMOTE") or None,
            remote_ttl=setting("LTC_CACHE_REMOTE_TTL", _positive(parse_age), None,
                               "entries stay in Redis until deleted"),
            lock_timeout=setting("LTC_CACHE_LOCK_TIMEOUT", _positive(_seconds), 600.0,
                                 "600 seconds"),
            secret=secret,
            fuse=setting("LTC_CACHE_FUSE", _fuse_mode, "background",
                         "background (libraries compiled out of band)"),
            fuse_timeout=setting("LTC_CACHE_FUSE_TIMEOUT", _positive(_seconds), 900.0,
                                 "900 seconds"),
        )


def _bad_setting(name: str, text: str, exc: ValueError, said: str) -> None:
    # Imported here: ltc-cache reads the configuration strictly and must
    # not pay for the warning machinery.
    from .diagnostics import warn_once

    shown = f"{name}={text!r}" if text else name
    warn_once(f"setting:{name}", f"ignoring {shown}: {exc}; using: {said}")
