"""The key that signs what becomes code when loaded (program entries, fused
libraries): the fleet's ``LTC_CACHE_SECRET``, or
a per-user key kept outside the cache directory (mode 0600), created on
first use. A program's artifact (a pickle) and a fused library (machine
code) are loaded only once their HMAC-SHA256 signature under this key
holds (:mod:`ltc_cache.program.program_entries`, :mod:`ltc_cache.graph.fused.library_entries`)."""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from .errors import UnsafeProgramKey

logger = logging.getLogger("ltc_cache.signing")


# The per-user signing key, created on first use (mode 0600).
KEY_FILE = "program.key"


_KEY_BYTES = 32


def _config_dir(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "ltc_cache"


def key_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where the per-user signing key of programs lives."""
    return _config_dir(os.environ if environ is None else environ) / KEY_FILE


def program_secret(shared: bytes | None, cache_dir: Path, *,
                   environ: Mapping[str, str] | None = None) -> bytes:
    """The key that signs program entries: ``shared`` (LTC_CACHE_SECRET,
    the fleet's key) where set, else a per-user key created on first use,
    mode 0600, under ``$XDG_CONFIG_HOME/ltc_cache`` (else
    ``~/.config/ltc_cache``). Raises OSError where there is none to be had
    safely (the file inside the cache directory, readable by others, owned
    by another user)."""
    if shared:
        return shared
    path = key_path(environ)
    if path.resolve().is_relative_to(Path(cache_dir).resolve()):
        raise UnsafeProgramKey(f"the program key {path} would be inside the cache "
                              f"directory {cache_dir}")
    try:
        return read_key(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temp = path.with_name(f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, secrets.token_hex(_KEY_BYTES).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(temp, path)  # fails where another process made it first: use that one
    except FileExistsError:
        pass
    finally:
        os.unlink(temp)
    logger.info("created the program signing key %s", path)
    return read_key(path)


def read_key(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise UnsafeProgramKey(f"the program key {path} belongs to another user")
        if st.st_mode & 0o077:
            raise UnsafeProgramKey(f"the program key {path} is readable or writable by "
                                  f"others (mode {st.st_mode & 0o777:o}); chmod 600 it")
        data = os.read(fd, 4096).strip()
    finally:
        os.close(fd)
    if len(data) < 32:
        raise UnsafeProgramKey(f"the program key {path} is too short")
    return data
