"""What the disk tier checks before it trusts a directory or a stored file.

A cache directory is code the next process runs (the stored IR is parsed
and executed), so whoever can write into it can run code as the user. The
directory must therefore be the user's own and closed to others; values are
read only from regular files inside it, never through a symlink; and an
index that SQLite reports damaged is told apart from one that is merely
busy, full or read-only, so that only the former is replaced.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import sqlite3
import stat
import time
from pathlib import Path

import diskcache

from ..errors import EntryError, NotACacheDirectory, UnsafeDirectory

__all__ = [
    "check_private_dir",
    "directory_id",
    "is_corruption",
    "is_write_failure",
    "read_value_file",
    "replace_index",
    "value_file_problem",
]

logger = logging.getLogger("ltc_cache.store.safety")

# diskcache names value files ``ab/cd/<28 hex>.val`` (Disk.filename); any
# other name in its index was not written by it.
_VALUE_NAME = re.compile(r"[0-9a-f]{2}/[0-9a-f]{2}/[0-9a-f]{28}\.val")

# SQLite result codes that describe the medium or other processes, not the
# file's contents: the index is fine, this operation just cannot run now.
# With them, SQLite's text for each (sqlite3_errstr), for errors that carry
# no code (Python < 3.11 sets none).
_ENVIRONMENT = {
    3: "access permission denied",  # PERM
    5: "database is locked",  # BUSY
    6: "database table is locked",  # LOCKED
    7: "out of memory",  # NOMEM
    8: "attempt to write a readonly database",  # READONLY
    9: "interrupted",  # INTERRUPT
    10: "disk I/O error",  # IOERR
    13: "database or disk is full",  # FULL
    14: "unable to open database file",  # CANTOPEN
    15: "locking protocol",  # PROTOCOL
    23: "authorization denied",  # AUTH
}


def _user(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def check_private_dir(path: Path, *, create: bool, allow_root: bool = False,
                      nested: bool = False) -> None:
    """Make sure only the current user can write into ``path``.

    ``create`` makes it (mode 0700; parents get the default mode). It must
    then belong to the current user (or root, with ``allow_root``: a cache
    baked into an image and read with LTC_CACHE_READONLY) and be writable by
    neither group nor others. ``nested`` (entries/, locks/) also refuses a
    symlink: the top directory may be a link the user made, the directories
    inside it are ours and never are. Raises UnsafeDirectory or OSError.
    """
    if create:
        try:
            path.mkdir(mode=0o700, parents=True)
        except FileExistsError:
            pass
        else:
            os.chmod(path, 0o700)  # mkdir's mode is filtered by the umask
    if nested and path.is_symlink():
        raise UnsafeDirectory(f"{path} is a symlink; ltc_cache refuses to follow it "
                              f"(remove it, or clear the cache)")
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise NotACacheDirectory(errno.ENOTDIR, "cache directory is not a directory", str(path))
    if not hasattr(os, "geteuid"):  # no owners or mode bits to check (Windows)
        return
    me = os.geteuid()
    if st.st_uid != me and not (allow_root and st.st_uid == 0):
        raise UnsafeDirectory(
            f"cache directory {path} belongs to {_user(st.st_uid)}, not to {_user(me)}: "
            f"its owner could plant entries that this process would run; "
            f"point LTC_CACHE_DIR at a directory of your own")
    writable_by = [who for who, bit in (("group", stat.S_IWGRP), ("others", stat.S_IWOTH))
                   if st.st_mode & bit]
    if writable_by:
        raise UnsafeDirectory(
            f"cache directory {path} is writable by {' and '.join(writable_by)} "
            f"(mode {stat.S_IMODE(st.st_mode):04o}): they could plant entries that this "
            f"process would run; run `chmod go-w {path}` or use another directory")


def value_file_problem(root: str, filename: object) -> str | None:
    """Why ``filename`` (from diskcache's index) is not a value file of
    ``root`` to open or delete, or None. A name diskcache did not make could
    lead out of the directory (``../``); a symlinked directory level, too."""
    if not isinstance(filename, str) or not _VALUE_NAME.fullmatch(filename):
        return f"value file name {filename!r} is not one diskcache writes"
    for sub in (filename[:2], filename[:5]):
        if os.path.islink(os.path.join(root, sub)):
            return f"value directory {sub} is a symlink"
    return None


def read_value_file(root: str, filename: str, max_bytes: int) -> bytes:
    """The bytes of value file ``filename`` under diskcache directory
    ``root``. Raises EntryError for a file it must not trust (odd name,
    symlink, not a regular file, over ``max_bytes``) and FileNotFoundError
    for one that is gone (deleted by another process: a miss)."""
    problem = value_file_problem(root, filename)
    if problem is not None:
        raise EntryError(f"{problem}; refused")
    path = os.path.join(root, filename)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK) or os.path.islink(path):
            raise EntryError(f"value file {filename} is a symlink; refused") from None
        raise
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise EntryError(f"value file {filename} is not a regular file; refused")
        if st.st_size > max_bytes:
            raise EntryError(f"value file {filename} holds {st.st_size} bytes, over the "
                             f"{max_bytes} byte bound; refused")
        # Read one byte past the bound: the file may grow after the fstat.
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise EntryError(f"value file {filename} is over the {max_bytes} byte bound; refused")
    return data


# The medium refuses writes: full, read-only, or not ours to write.
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM,
                           getattr(errno, "EDQUOT", errno.ENOSPC)})
_WRITE_CODES = frozenset({3, 8, 13})  # PERM, READONLY, FULL


def is_write_failure(exc: BaseException) -> bool:
    """Whether ``exc`` says the directory cannot take writes (full disk,
    read-only mount, permissions), as opposed to being damaged."""
    if isinstance(exc, OSError):
        return exc.errno in _WRITE_ERRNOS
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None:
            return code & 0xFF in _WRITE_CODES
        return any(_ENVIRONMENT[c] in str(exc) for c in _WRITE_CODES)
    return False


def is_corruption(exc: BaseException) -> bool:
    """Whether an error from diskcache means its index is damaged.

    A flipped byte in the SQLite file surfaces as SQLITE_CORRUPT, as a
    schema SQLite cannot parse, as text that is not UTF-8, or as a setting
    or file name of the wrong type that diskcache's own code then trips
    over (TypeError, AttributeError, ...). Errors of the medium (busy, full,
    read-only, I/O: OSError or those SQLite codes), diskcache's lock
    timeout and refused entries are not corruption.
    """
    if isinstance(exc, (OSError, EntryError, diskcache.Timeout, MemoryError)) \
            or not isinstance(exc, Exception):
        return False
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None:
            environment = code & 0xFF in _ENVIRONMENT
        else:
            environment = any(text in str(exc) for text in _ENVIRONMENT.values())
        return not environment and isinstance(exc, sqlite3.DatabaseError)
    return True


def directory_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def replace_index(entries: Path, locks: Path, seen: tuple[int, int] | None) -> bool:
    """Remove the damaged diskcache directory ``entries`` so a new one can be
    made; True if this call removed it.

    ``seen`` identifies the directory the caller found damaged: if another
    process has already replaced it, there is nothing to do. The swap is a
    rename (other processes see the old index or none, never half of one),
    made under a lock so two processes that notice at once replace it once.
    """
    import filelock  # here: a warm process never replaces an index (store/disk.py, lock)

    with filelock.FileLock(str(locks / ".index.lock"), timeout=60):
        if seen is None or directory_id(entries) != seen:
            return False
        aside = entries.with_name(f"{entries.name}.damaged.{os.getpid()}.{time.time_ns()}")
        os.rename(entries, aside)
        # The entries in it cannot be found without their index.
        with contextlib.suppress(OSError):
            shutil.rmtree(aside)
        logger.warning("removed damaged cache index %s (in LTC_CACHE_DIR)", entries)
        return True
