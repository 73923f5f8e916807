"""The commands that change what a cache holds: ``prune``, ``clear``,
``export`` and ``import`` (``fuse``: fuse.py), one function each, taking
the parsed arguments, the opened tier and the configuration and returning
the exit status; what they plan and find comes from the report package."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

from ..config import CacheConfig
from ..errors import BundleError, UsageError
from ..report import (
    DeletePlan,
    EntryFilter,
    EntryInfo,
    export_bundle,
    import_bundle,
    plan_clear,
    plan_prune,
    remove_free_lock_files,
    scan,
)
from ..store.disk import DiskStore
from ..units import format_size
from .inspection import find_key
from .output import OK, PROBLEMS, Progress, confirm, counted, print_error, print_line, table_lines

__all__ = ["cmd_clear", "cmd_export", "cmd_import", "cmd_prune", "filtered_entries"]

# Rows of a deletion plan shown before the totals.
_PLAN_ROWS = 50


def _print_plan(plan: DeletePlan) -> None:
    rows = [[e.short_key, e.graph_name, e.size_str, e.last_used_str, plan.reasons[e.key]]
            for e in plan.entries[:_PLAN_ROWS]]
    if rows:
        print_line("\n".join(table_lines(["KEY", "NAME", "SIZE", "LAST USED", "WHY"], rows,
                                          right={2})))
    if len(plan.entries) > _PLAN_ROWS:
        print_line(f"… and {len(plan.entries) - _PLAN_ROWS} more")
    records = f" and {counted(len(plan.records), 'internal record')}" if plan.records else ""
    print_line(f"Will delete {counted(len(plan.entries), 'entry')}{records}, "
               f"freeing {plan.expected_freed_size_str}.")


def _run_plan(plan: DeletePlan, store: DiskStore, args: argparse.Namespace) -> int:
    if not plan.entries and not plan.records:
        print_line("Nothing to delete.")
        return OK
    _print_plan(plan)
    if args.dry_run:
        print_line("Dry run: nothing deleted.")
        return OK
    if not confirm("Delete them?", args.yes):
        print_line("Nothing deleted.")
        return PROBLEMS
    with Progress("deleting", len(plan.entries)) as progress:
        removed = plan.execute(store, progress=progress)
    records = f" and {counted(len(plan.records), 'internal record')}" if plan.records else ""
    print_line(f"Deleted {counted(removed, 'entry')}{records}, "
               f"freed {plan.expected_freed_size_str}.")
    if plan.records and isinstance(store, DiskStore):  # a clear: the lock files too
        locks = remove_free_lock_files(store.directory)
        if locks:
            print_line(f"Removed {counted(locks, 'lock file')} no process held.")
    return OK


def cmd_prune(args: argparse.Namespace, store: DiskStore, config: CacheConfig) -> int:
    if args.max_size is None and args.older_than is None and not args.stale and not args.cpu:
        raise UsageError("prune what? give --max-size, --older-than, --stale and/or --cpu")
    plan = plan_prune(scan(store), max_size=args.max_size, older_than=args.older_than,
                      stale=args.stale, cpus=args.cpu)
    return _run_plan(plan, store, args)


def cmd_clear(args: argparse.Namespace, store: DiskStore, config: CacheConfig) -> int:
    return _run_plan(plan_clear(scan(store)), store, args)



def _select(store: DiskStore, filters: Sequence[EntryFilter], prefixes: Sequence[str],
            ) -> tuple[list[EntryInfo], int]:
    return filtered_entries(scan(store).entries, filters, prefixes)


def filtered_entries(scanned: Sequence[EntryInfo], filters: Sequence[EntryFilter],
                     prefixes: Sequence[str]) -> tuple[list[EntryInfo], int]:
    """The readable entries of ``scanned`` that pass every filter (and
    whose keys ``prefixes`` name, where given), and how many unreadable
    ones passed too."""
    now = time.time()
    entries = [e for e in scanned if all(f(e, now) for f in filters)]
    if prefixes:
        wanted = {find_key(scanned, p) for p in prefixes}
        entries = [e for e in entries if e.key in wanted]
    unreadable = sum(1 for e in entries if e.problem)
    return [e for e in entries if not e.problem], unreadable


def cmd_export(args: argparse.Namespace, store: DiskStore, config: CacheConfig) -> int:
    path = Path(args.file)
    if path.is_dir():
        raise UsageError(f"{path} is a directory; give the bundle file to write, "
                         f"e.g. {path / 'cache.ltcb'}")
    if not path.parent.is_dir():
        raise UsageError(f"no directory {path.parent} to write {path.name} in")
    if path.exists() and not args.force:
        raise UsageError(f"{path} exists; give --force to overwrite it")
    entries, unreadable = _select(store, args.filter, args.key)
    with Progress("exporting", len(entries)) as progress:
        written = export_bundle(store, [e.key for e in entries], path, progress=progress)
    size = sum(e.size for e in entries)
    print_line(f"Exported {counted(written, 'entry')} ({format_size(size)}) to {path}.")
    if unreadable:
        print_line(f"Left out {counted(unreadable, 'unreadable entry')} (see `ltc-cache verify`).")
    return OK


def cmd_import(args: argparse.Namespace, store: DiskStore, config: CacheConfig) -> int:
    path = Path(args.file)
    if not path.is_file():
        raise UsageError(f"no bundle at {path}")
    with Progress("importing") as progress:
        def on_header(count: int) -> None:
            progress.total = count

        try:
            result = import_bundle(store, path, secret=config.secret, progress=progress,
                                   on_header=on_header)
        except BundleError as exc:
            raise UsageError(f"{path}: {exc}") from None
    for problem in result.rejected:
        print_line(f"REJECTED {problem.key[:12]}  {problem.problem}")
    print_line(f"Imported {counted(len(result.added), 'entry')} into {store.directory}; "
               f"{len(result.present)} already there, {len(result.rejected)} rejected.")
    if result.other_torch:
        print_line(f"{result.other_torch} of them were made by another torch version and will not "
                   "be used by this one (`ltc-cache prune --stale` removes them).")
    if result.error:
        print_error(f"{path}: {result.error}; the entries before it were imported")
    return OK if result.ok else PROBLEMS
