"""``ltc-cache fuse``: compile the fused libraries of stored graphs ahead,
a line per graph as it finishes.

Resumable by construction: each library (or refusal) is stored as soon as
it is compiled, and a graph whose fused entry is stored is skipped, so a
run stopped with Ctrl-C continues where it stopped when run again.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from ..config import CacheConfig
from ..errors import UsageError
from ..report import FuseOutcome, FuseTarget, fuse_one, plan_fuse, scan, sort_entries
from ..report.fused import GONE, LIBRARY, NOT_STORED, REFUSED
from ..signing import program_secret
from ..store.disk import DiskStore
from .maintenance import filtered_entries
from .output import OK, PROBLEMS, counted, print_line

__all__ = ["INTERRUPTED", "cmd_fuse"]

# Exit status of a run stopped with Ctrl-C (128 + SIGINT), as main's.
INTERRUPTED = 130


def cmd_fuse(args: argparse.Namespace, store: DiskStore, config: CacheConfig) -> int:
    report = scan(store)
    selected, unreadable = filtered_entries(report.entries, args.filter, args.key)
    # Most recently used first: a run stopped early has fused the graphs in use.
    targets = plan_fuse(sort_entries(selected, "accessed"), report.entries)
    if unreadable:
        print_line(f"Left out {counted(unreadable, 'unreadable entry')} (see `ltc-cache verify`).")
    if not targets:
        matching = " match" if args.filter or args.key else ""
        other = f" ({counted(len(selected), 'entry')} of other kinds: fuse compiles graphs)" \
            if selected else ""
        print_line(f"No graph entries{matching} in {report.directory}{other}.")
        return OK
    if args.dry_run:
        return _dry_run(targets, args.retry)
    return _fuse(targets, store, config, args)


def _dry_run(targets: Sequence[FuseTarget], retry: bool) -> int:
    for i, target in enumerate(targets, 1):
        if target.compiles(retry):
            state = "would compile" + (" again (refused before)" if target.stored else "")
        elif target.stored == "library":
            state = "already fused"
        else:
            state = "already refused (--retry compiles it again)"
        print_line(f"{_prefix(i, len(targets), target)}: {state}")
    compiling = sum(t.compiles(retry) for t in targets)
    print_line(f"Dry run: {compiling} of {counted(len(targets), 'graph')} to compile; "
               "nothing compiled.")
    return OK


def _fuse(targets: Sequence[FuseTarget], store: DiskStore, config: CacheConfig,
          args: argparse.Namespace) -> int:
    directory = Path(store.directory)
    try:  # before the first compile, not after it: a run that cannot sign stores nothing
        program_secret(config.secret, directory)
    except OSError as exc:
        raise UsageError(f"cannot sign fused libraries: {exc}") from None
    from ..graph.cache import GraphCache

    # The directory this command opened, not the tiers of the environment:
    # libraries are machine code for this machine, and Redis is shared.
    cache = GraphCache(dataclasses.replace(config, directory=directory, remote=None,
                                           readonly=False), store=store)
    timeout = args.timeout or config.fuse_timeout
    compiling = sum(t.compiles(args.retry) for t in targets)
    print_line(f"Fusing {counted(len(targets), 'graph')} in {directory}: {compiling} to compile, "
               f"each within {timeout:g} s. Ctrl-C stops; running it again continues.")
    sys.stdout.flush()
    started, outcomes = time.monotonic(), []
    try:
        with _quiet_torch():
            for i, target in enumerate(targets, 1):
                outcome = fuse_one(cache, target.graph.key, target.graph.graph_name,
                                   retry=args.retry, timeout=timeout)
                outcomes.append(outcome)
                print_line(f"{_prefix(i, len(targets), target)}: {outcome.summary_str}")
                sys.stdout.flush()  # a line as each graph finishes, into a pipe too
    except KeyboardInterrupt:
        print_line(f"\nInterrupted at graph {len(outcomes) + 1} of {len(targets)}: "
                   f"{_tally(outcomes)}. What was compiled is stored; run the same command "
                   "again to continue (graphs with a stored fused entry are skipped).")
        return INTERRUPTED
    print_line(f"Done in {time.monotonic() - started:.1f} s: {_tally(outcomes)}.")
    return PROBLEMS if any(o.status == NOT_STORED for o in outcomes) else OK


def _prefix(i: int, n: int, target: FuseTarget) -> str:
    return f"[{i}/{n}] {target.graph.graph_name} {target.graph.short_key}"


def _tally(outcomes: Sequence[FuseOutcome]) -> str:
    """``2 libraries compiled, 1 refused, 3 skipped (already fused or refused)``."""
    counts = Counter(o.status for o in outcomes)
    skipped = sum(1 for o in outcomes if not o.compiled and o.status != GONE)
    parts = [f"{counted(counts[LIBRARY], 'library')} compiled", f"{counts[REFUSED]} refused",
             f"{skipped} skipped (already fused or refused)"]
    if counts[GONE]:
        parts.append(f"{counts[GONE]} no longer stored")
    if counts[NOT_STORED]:
        parts.append(f"{counts[NOT_STORED]} compiled but not stored")
    return ", ".join(parts)


@contextmanager
def _quiet_torch() -> Iterator[None]:
    """Torch's deprecation notices from inside export and Inductor say
    nothing to a user of this command; the cache's own warnings (a store
    that failed: RuntimeWarning) still show."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        yield
