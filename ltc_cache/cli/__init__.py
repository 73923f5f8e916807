"""``ltc-cache``: look after a cache directory and the Redis tier under it.

    ltc-cache [--dir DIR] [--remote URL | --local] ls | stats | show KEY | prune
                          | clear | verify | export FILE | import FILE | fuse

The tier options work before or after the command. The directory is
``--dir``, else the library's; Redis is included with ``--remote`` or
LTC_CACHE_REMOTE (``--remote`` without ``--dir``: Redis alone).

The only package of ltc_cache that prints; what it shows comes from the
report package. Here: ``main`` and opening the tiers a command runs on;
``parser.py`` the arguments, ``inspection.py`` the commands that look
(``ls``, ``stats``, ``show``, ``verify``), ``maintenance.py`` those that
change the cache (``fuse.py`` the one that compiles), ``output.py`` what
they write. Exit status: 0
fine; 1 problems found (bad entries, rejected imports, a declined prompt,
an I/O failure); 2 usage errors (bad arguments, no cache directory, an
unknown key, a read-only cache for ``fuse``); 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path

from ..config import CacheConfig
from ..errors import NoCache, UsageError
from ..report.remote import RemoteTier
from ..store.disk import DiskStore
from ..store.tiers import open_directory
from .output import (
    OK,
    PROBLEMS,
    USAGE,
    gather_json,
    gathering_json,
    json_tier,
    print_error,
    print_gathered_json,
    print_line,
)
from .parser import build_parser

__all__ = ["main"]


def _writes(args: argparse.Namespace) -> bool:
    """Whether the command changes the directory; the others open it
    read-only, so they work on a read-only mount and change no access time."""
    return (args.command in ("prune", "clear", "import")
            or (args.command == "fuse" and not args.dry_run)
            or bool(getattr(args, "zero", False) or getattr(args, "fix", False)))


# Commands that work on one tier: the directory where there is one.
_ONE_TIER = ("show", "export", "import", "fuse")

# Commands that need that tier to be a directory, and why.
_DIRECTORY_ONLY = {
    "import": "import adds to a cache directory; give --dir (the library copies entries to "
              "Redis as it stores them)",
    "fuse": "fuse compiles libraries for this machine into a cache directory; give --dir",
}


def _tiers(args: argparse.Namespace, config: CacheConfig) -> list[tuple[str, str]]:
    """("local", directory) and/or ("remote", url), in that order: the
    directory unless ``--remote`` alone names Redis; Redis with ``--remote``
    or LTC_CACHE_REMOTE, unless ``--local``."""
    if args.dir is not None and not args.dir.strip():
        raise UsageError("--dir is empty; give a cache directory")
    if args.local and args.remote:
        raise UsageError("--local and --remote exclude each other")
    remote = None if args.local else (args.remote or config.remote)
    tiers = []
    if not (args.remote and args.dir is None):
        tiers.append(("local", args.dir or str(config.directory)))
    if remote:
        tiers.append(("remote", remote))
    if args.command in _ONE_TIER:
        if args.command in _DIRECTORY_ONLY and tiers[0][0] == "remote":
            raise UsageError(_DIRECTORY_ONLY[args.command])
        tiers = tiers[:1]
    return tiers


def _refuse_read_only(args: argparse.Namespace, config: CacheConfig) -> None:
    """``fuse`` under LTC_CACHE_READONLY: everything it compiles would be
    thrown away (the library stores nothing then), so it does not start."""
    if args.command == "fuse" and not args.dry_run and config.readonly:
        raise UsageError("the cache is read-only here (LTC_CACHE_READONLY is set) and fuse "
                         "stores what it compiles; unset it for this command, or give "
                         "--dry-run to see what would be compiled")


def _open_local(args: argparse.Namespace, config: CacheConfig, directory: Path) -> DiskStore:
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"{directory} is not a directory")
    try:
        return open_directory(directory, create=args.command == "import",
                              readonly=not _writes(args), max_size=config.max_size)
    except NoCache as exc:
        if args.dir:
            raise UsageError(str(exc)) from None
        origin = ("LTC_CACHE_DIR" if os.environ.get("LTC_CACHE_DIR")
                  else "the default; give --dir or set LTC_CACHE_DIR")
        raise UsageError(f"{exc} ({origin})") from None
    except (OSError, sqlite3.Error) as exc:
        raise UsageError(f"cannot open the cache at {directory}: {exc}") from None


def _open_remote(url: str) -> RemoteTier:
    try:
        return RemoteTier(url)
    except (ImportError, ValueError) as exc:
        raise UsageError(str(exc)) from None


def _run_tier(args: argparse.Namespace, config: CacheConfig, kind: str, where: str) -> int:
    try:
        store = (_open_local(args, config, Path(where).expanduser()) if kind == "local"
                 else _open_remote(where))
    except UsageError as exc:
        print_error(str(exc))
        return USAGE
    try:
        return args.run(args, store, config)
    except UsageError as exc:
        print_error(str(exc))
        return USAGE
    except BrokenPipeError:  # `ltc-cache ls | head`: the reader has all it wants
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return PROBLEMS
    except (OSError, sqlite3.Error) as exc:
        print_error(f"{type(exc).__name__}: {exc}")
        return PROBLEMS
    finally:
        store.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = CacheConfig.from_env(strict=True)
    except ValueError as exc:
        print_error(f"bad setting: {exc}")
        return USAGE
    try:
        _refuse_read_only(args, config)
        tiers = _tiers(args, config)
    except UsageError as exc:
        print_error(str(exc))
        return USAGE
    if len(tiers) > 1 and getattr(args, "json", False):
        gather_json()
    status = OK
    try:
        for index, (kind, where) in enumerate(tiers):
            if len(tiers) > 1 and not gathering_json():
                print_line(("" if index == 0 else "\n")
                           + ("== cache directory ==" if kind == "local" else "== Redis tier =="))
            json_tier(kind)
            code = _run_tier(args, config, kind, where)
            if code == USAGE:
                return USAGE
            status = max(status, code)
    except KeyboardInterrupt:
        print_error("interrupted")
        return 130
    finally:
        print_gathered_json()
    return status
