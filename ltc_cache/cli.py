"""``ltc-cache``: look after a cache directory.

    ltc-cache [--dir DIR] ls | stats | show KEY | prune | clear | verify
                          | export FILE | import FILE

The only module of ltc_cache that prints; what it shows comes from the
report package. Exit status: 0 fine; 1 problems found (bad entries, rejected
imports, a declined prompt, an I/O failure); 2 usage errors (bad arguments,
no cache directory, an unknown key).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from .config import CacheConfig
from .errors import EntryError
from .report import (
    SORT_FIELDS,
    STAT_LABELS,
    STAT_NAMES,
    DeletePlan,
    EntryFilter,
    EntryInfo,
    NoCache,
    collect_stats,
    describe_source,
    export_bundle,
    import_bundle,
    load_entry,
    open_store,
    parse_filter,
    plan_clear,
    plan_prune,
    resolve_key,
    scan,
    sort_entries,
    verify,
)
from .store.bundle import BundleError
from .store.disk import DiskStore
from .units import format_size, parse_age, parse_size

__all__ = ["main"]

OK, PROBLEMS, USAGE = 0, 1, 2
# Rows of a deletion plan shown before the totals.
_PLAN_ROWS = 50


class UsageError(Exception):
    """Bad input on the command line: exit status 2."""


def _out(text: str = "") -> None:
    sys.stdout.write(text + "\n")


def _err(text: str) -> None:
    sys.stderr.write(f"ltc-cache: {text}\n")


def _json(obj: Any) -> None:
    # Indented for a person at a terminal; compact for a program, since the
    # json module's C encoder is used only without indentation (5x faster
    # on a 10,000-entry listing).
    indent = 2 if sys.stdout.isatty() else None
    _out(json.dumps(obj, indent=indent, default=str))


def _stamp(timestamp: float | None) -> str:
    if not timestamp:
        return "-"
    return datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


class _Progress:
    """A progress bar on stderr when it is a terminal, nothing when piped."""

    def __init__(self, label: str, total: int = 0, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.label = label
        self.total = total
        self.done = 0
        self.enabled = self.stream.isatty()
        self._drawn_at = 0.0

    def __call__(self, amount: int = 1) -> None:
        self.done += amount
        now = time.monotonic()
        if self.enabled and self.total and (now - self._drawn_at > 0.1 or self.done >= self.total):
            self._drawn_at = now
            filled = 30 * min(self.done, self.total) // self.total
            self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (30 - filled)}] "
                              f"{self.done}/{self.total}")
            self.stream.flush()

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled and self._drawn_at:
            self.stream.write("\r\033[K")
            self.stream.flush()


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    """Aligned lines, columns in ``right`` right-aligned. One format string
    for every row: a 10,000-row listing is drawn in C, not cell by cell."""
    lines = [headers, *rows]
    widths = [max(map(len, column)) for column in zip(*lines, strict=True)]
    template = "  ".join(f"{{:{'>' if i in right else '<'}{w}}}" for i, w in enumerate(widths))
    return [template.format(*cells).rstrip() for cells in lines]


def _confirm(question: str, assume_yes: bool) -> bool:
    if assume_yes:
        return True
    sys.stdout.write(f"{question} [y/N] ")
    sys.stdout.flush()
    answer = sys.stdin.readline()
    if not sys.stdin.isatty():
        _out()
    return answer.strip().lower() in ("y", "yes")


# -- commands --

def _cmd_ls(args: argparse.Namespace, store: DiskStore, config: CacheConfig) -> int:
    report = scan(store)
    now = time.time()
    shown = [e for e in report.entries if all(f(e, now) for f in args.filter)]
    shown = sort_entries(shown, args.sort, reverse=args.reverse)
    size, hits = sum(e.size for e in shown), sum(e.hits for e in shown)
    if args.json:
        _json({
            "directory": str(report.directory),
            "entries": [e.as_dict() for e in shown],
            "total": {"entries": len(shown), "size": size, "hits": hits,
                      "unreadable": sum(1 for e in shown if e.problem)},
            "internal_records": {"count": report.internal_records,
                                 "size": report.internal_size},
        })
        return OK
    good = [e for e in shown if not e.problem]
    # Graphs are the rule; the column appears where there are other kinds
    # (negative entries: graphs LTC cannot extract, remembered as such).
    with_kind = any(e.kind not in (None, "graph") for e in good)
    headers = ["KEY", "NAME", *(["KIND"] if with_kind else []), "OPS", "INPUTS", "SIZE",
               "CREATED", "LAST USED", "HITS", "TORCH"]
    rows = [[e.short_key, e.graph_name, *([e.kind or "graph"] if with_kind else []),
             str(e.node_count), str(e.num_inputs), e.size_str, e.created_str,
             e.last_used_str, str(e.hits), e.torch_version] for e in good]
    first_number = 3 if with_kind else 2
    lines = _table(headers, rows, right=set(range(first_number, first_number + 3))
                   | {len(headers) - 2}) if rows else []
    lines += [f"! {e.short_key}  {e.size_str}  {e.problem}" for e in shown if e.problem]
    of = f" of {len(report.entries)}" if len(shown) != len(report.entries) else ""
    total = f"{len(shown)}{of} entries, {format_size(size)}, {hits} hits"
    bad = len(shown) - len(good)
    if bad:
        total += f"; {bad} unreadable (see `ltc-cache verify`)"
    lines.append(total if rows or bad else f"No entries{' match' if of else ''} in "
                 f"{report.directory}.")
    _out("\n".join(lines))
    return OK


def _cmd_stats(args: argparse.Namespace, store: DiskStore, config: CacheConfig) -> int:
    if args.zero:
        store.ledger.zero()
        _out(f"Statistics of {store.directory} zeroed.")
        return OK
    stats = collect_stats(store, size_limit=config.max_size)
    if args.json:
        _json(stats.as_dict())
        return OK
    c = stats.counters
    rows = [
        ("Cache directory", str(stats.directory)),
        ("Entries", f"{stats.entries} ({stats.entry_size_str})"),
        ("Internal records", f"{stats.internal_records} ({stats.internal_size_str})"),
        ("Disk usage", stats.disk_usage_str),
        ("Size limit", stats.size_limit_str + (" (LTC_CACHE_MAX_SIZE)" if stats.size_limit
                                               else "")),
        ("Hits", str(c["hits"])),
        ("Misses", str(c["misses"])),
        ("Hit rate", stats.hit_rate_str),
        *((STAT_LABELS.get(name, name.capitalize()), str(c[name])) for name in STAT_NAMES
          if name not in ("hits", "misses")),
        ("Counting since", "first use" if stats.zeroed_at is None
         else f"{stats.zeroed_at_str} (stats --zero)"),
    ]
    width = max(len(name) for name, _ in rows)
    _out("\n".join(f"{name:<{width}}  {value}" for name, value in rows))
    return OK


def _find(entries: Sequence[EntryInfo], prefix: str) -> str:
    try:
        return resolve_key((e.key for e in entries), prefix)
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None
    except ValueError as exc:  # AmbiguousKey, or not hex
        raise UsageError(str(exc)) from None


def _cmd_show(args: argparse.Namespace, store: DiskStore, config: CacheConfig) -> int:
    entries = scan(store).entries
    key = _find(entries, args.key)
    info = next(e for e in entries if e.key == key)
    try:
        entry = load_entry(store, key, secret=config.secret)
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None
    except EntryError as exc:
        _err(f"entry {key[:12]} cannot be read: {exc}")
        return PROBLEMS
    meta = dict(entry.meta)
    inputs = [describe_source(s) for s in entry.inputs]
    outputs = [describe_source(s) for s in entry.outputs]
    updates = [f"output {u.output} -> {describe_source(u.target)}" for u in entry.updates]
    if args.json:
        _json({
            **info.as_dict(),
            "meta": meta, "inputs": inputs, "outputs": outputs, "updates": updates,
            **({} if args.no_ir else {"ir": entry.ir}),
        })
        return OK
    fields = [
        ("Key", key),
        ("Name", entry.graph_name),
        ("Kind", str(meta.get("kind", "graph"))),
        ("Ops", str(meta.get("node_count", "?"))),
        ("Size", info.size_str),
        ("Created", f"{_stamp(entry.created)} ({info.created_str})"),
        ("Last used", f"{_stamp(info.last_used)} ({info.last_used_str})"),
        ("Hits", str(info.hits)),
        ("Torch", str(meta.get("torch_version", "?"))),
        ("Graph hash", str(meta.get("graph_hash", "?"))),
    ]
    fields += [(f"Key part {name}", value[:16])
               for name, value in sorted(dict(meta.get("key_parts") or {}).items())]
    fields += [(name, str(value)) for name, value in sorted(meta.items())
               if name not in {"graph_name", "kind", "node_count", "created", "torch_version",
                               "graph_hash", "key_parts", "plan", "backward", "joint"}]
    # Aten graphs: their sizes here, whole in --json.
    for label, name in (("Plan", "plan"), ("Backward", "backward")):
        if isinstance(meta.get(name), dict):
            graph = meta[name]
            fields.append((label, f"{len(graph.get('nodes') or ())} nodes, "
                                  f"{len(graph.get('constants') or ())} tensor constants "
                                  "(the graph: --json)"))
    if isinstance(meta.get("joint"), dict):  # a training plan's layout
        joint = meta["joint"]
        fields.append(("Joint", f"{joint.get('outputs')} outputs, "
                                f"{joint.get('saved')} + {joint.get('saved_unchecked')} "
                                f"saved tensors, {len(joint.get('tangents') or ())} tangents"))
    width = max(len(name) for name, _ in fields)
    lines = [f"{name:<{width}}  {value}" for name, value in fields]
    lines += ["", f"Inputs ({len(inputs)}), in graph parameter order:"]
    lines += [f"  %p{i:<4} {text}" for i, text in enumerate(inputs)]
    lines += ["", f"Outputs ({len(outputs)}):"]
    lines += [f"  {i:<5} {text}" for i, text in enumerate(outputs)]
    if updates:
        lines += ["", f"In-place updates ({len(updates)}):", *(f"  {u}" for u in updates)]
    if not args.no_ir:
        lines += ["", "IR:", *(f"  {line}" for line in (entry.ir or "(empty)").splitlines())]
    _out("\n".join(lines))
    return OK


def _print_plan(plan: DeletePlan) -> None:
    rows = [[e.short_key, e.graph_name, e.size_str, e.last_used_str, plan.reasons[e.key]]
            for e in plan.entries[:_PLAN_ROWS]]
    if rows:
        _out("\n".join(_table(["KEY", "NAME", "SIZE", "LAST USED", "WHY"], rows, right={2})))
    if len(plan.entries) > _PLAN_ROWS:
        _out(f"… and {len(plan.entries) - _PLAN_ROWS} more")
    _out(f"Will delete {len(plan.entries)} entries, freeing {plan.expected_freed_size_str}.")


def _run_plan(plan: DeletePlan, store: DiskStore, args: argparse.Namespace) -> int:
    if not plan.entries:
        _out("Nothing to delete.")
        return OK
    _print_plan(plan)
    if args.dry_run:
        _out("Dry run: nothing deleted.")
        return OK
    if not _confirm("Delete them?", args.yes):
        _out("Nothing deleted.")
        return PROBLEMS
    with _Progress("deleting", len(plan.entries)) as progress:
        removed = plan.execute(store, progress=progress)
    _out(f"Deleted {removed} entries, freed {plan.expected_freed_size_str}.")
    return OK


def _cmd_prune(args: argparse.Namespace, store: DiskStore, config: CacheConfig) -> int:
    if args.max_size is None and args.older_than is None and not args.stale:
        raise UsageError("prune what? give --max-size, --older-than and/or --stale")
    plan = plan_prune(scan(store), max_size=args.max_size, older_than=args.older_than,
                      stale=args.stale)
    return _run_plan(plan, store, args)


def _cmd_clear(args: argparse.Namespace, store: DiskStore, config: CacheConfig) -> int:
    return _run_plan(plan_clear(scan(store)), store, args)


def _cmd_verify(args: argparse.Namespace, store: DiskStore, config: CacheConfig) -> int:
    keys = [e.key for e in scan(store).entries]
    with _Progress("verifying", len(keys)) as progress:
        result = verify(store, keys, secret=config.secret, progress=progress)
    removed = store.discard([p.key for p in result.problems]) if args.fix else []
    if args.json:
        _json({"checked": result.checked,
               "problems": [{"key": p.key, "problem": p.problem} for p in result.problems],
               "removed": removed})
    else:
        for p in result.problems:
            _out(f"BAD {p.key[:12]}  {p.problem}")
        summary = f"Checked {result.checked} entries: {len(result.problems)} bad"
        summary += f", {len(removed)} removed." if args.fix else "."
        if result.problems and not args.fix:
            summary += " `ltc-cache verify --fix` removes them."
        _out(summary)
    return OK if len(removed) == len(result.problems) else PROBLEMS


def _select(store: DiskStore, filters: Sequence[EntryFilter], prefixes: Sequence[str],
            ) -> tuple[list[EntryInfo], int]:
    scanned = scan(store).entries
    now = time.time()
    entries = [e for e in scanned if all(f(e, now) for f in filters)]
    if prefixes:
        wanted = {_find(scanned, p) for p in prefixes}
        entries = [e for e in entries if e.key in wanted]
    unreadable = sum(1 for e in entries if e.problem)
    return [e for e in entries if not e.problem], unreadable


def _cmd_export(args: argparse.Namespace, store: DiskStore, config: CacheConfig) -> int:
    entries, unreadable = _select(store, args.filter, args.key)
    path = Path(args.file)
    if not path.parent.is_dir():
        raise UsageError(f"no directory {path.parent} to write {path.name} in")
    with _Progress("exporting", len(entries)) as progress:
        written = export_bundle(store, [e.key for e in entries], path, progress=progress)
    size = sum(e.size for e in entries)
    _out(f"Exported {written} entries ({format_size(size)}) to {path}.")
    if unreadable:
        _out(f"Left out {unreadable} unreadable entries (see `ltc-cache verify`).")
    return OK


def _cmd_import(args: argparse.Namespace, store: DiskStore, config: CacheConfig) -> int:
    path = Path(args.file)
    if not path.is_file():
        raise UsageError(f"no bundle at {path}")
    with _Progress("importing") as progress:
        def on_header(count: int) -> None:
            progress.total = count

        try:
            result = import_bundle(store, path, secret=config.secret, progress=progress,
                                   on_header=on_header)
        except BundleError as exc:
            raise UsageError(f"{path}: {exc}") from None
    for problem in result.rejected:
        _out(f"REJECTED {problem.key[:12]}  {problem.problem}")
    _out(f"Imported {len(result.added)} entries into {store.directory}; "
         f"{len(result.present)} already there, {len(result.rejected)} rejected.")
    if result.other_torch:
        _out(f"{result.other_torch} of them were made by another torch version and will not "
             "be used by this one (`ltc-cache prune --stale` removes them).")
    if result.error:
        _err(f"{path}: {result.error}; the entries before it were imported")
    return OK if result.ok else PROBLEMS


# -- arguments --

def _arg(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = parse.__name__
    return convert


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ltc-cache",
        description="Inspect and maintain an ltc_cache directory of compiled LTC graphs.",
        epilog="Exit status: 0 fine, 1 problems found, 2 usage error.")
    parser.add_argument("--dir", metavar="DIR",
                        help="cache directory (default: LTC_CACHE_DIR, else the user cache dir)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run: Callable[..., int], help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        sub.set_defaults(run=run)
        return sub

    def filters(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--filter", action="append", default=[], type=_arg(parse_filter),
                         metavar="EXPR", help="FIELD OP VALUE, e.g. size>1MB, accessed>30d "
                         "(not used for 30 days), created<2h, hits=0, name=gpt2*; repeatable")

    ls = command("ls", _cmd_ls, "list entries")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.add_argument("--sort", choices=sorted(SORT_FIELDS), default="accessed",
                    help="order by this (default: accessed, most recent first)")
    ls.add_argument("--reverse", "-r", action="store_true", help="reverse the order")
    filters(ls)

    stats = command("stats", _cmd_stats, "entries, sizes and hit/miss counts of every process")
    stats.add_argument("--json", action="store_true", help="machine-readable output")
    stats.add_argument("--zero", action="store_true", help="reset the counters")

    show = command("show", _cmd_show, "an entry's metadata, input layout and stored IR")
    show.add_argument("key", help="entry key or a unique prefix of it")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.add_argument("--no-ir", action="store_true", help="leave out the IR")

    def deleting(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--dry-run", action="store_true", help="show the plan, delete nothing")
        sub.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")

    prune = command("prune", _cmd_prune, "delete entries by size, age or staleness")
    prune.add_argument("--max-size", type=_arg(parse_size), metavar="SIZE",
                       help="delete least recently used entries until the rest fit, e.g. 2GB")
    prune.add_argument("--older-than", type=_arg(parse_age), metavar="AGE",
                       help="delete entries not used for AGE, e.g. 30d, 12h")
    prune.add_argument("--stale", action="store_true",
                       help="delete entries of another torch version or entry schema")
    deleting(prune)

    clear = command("clear", _cmd_clear, "delete every entry")
    deleting(clear)

    check = command("verify", _cmd_verify,
                    "check every entry (checksum, decoding, the IR parses)")
    check.add_argument("--fix", action="store_true", help="delete the bad entries")
    check.add_argument("--json", action="store_true", help="machine-readable output")

    export = command("export", _cmd_export, "write entries to one portable bundle file")
    export.add_argument("file", help="bundle to write")
    export.add_argument("--key", action="append", default=[], metavar="PREFIX",
                        help="only this entry (repeatable)")
    filters(export)

    imports = command("import", _cmd_import, "add the entries of a bundle, each checked first")
    imports.add_argument("file", help="bundle to read")
    return parser


def _writes(args: argparse.Namespace) -> bool:
    """Whether the command changes the directory; the others open it
    read-only, so they work on a read-only mount and change no access time."""
    return (args.command in ("prune", "clear", "import")
            or bool(getattr(args, "zero", False) or getattr(args, "fix", False)))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = CacheConfig.from_env()
    except ValueError as exc:
        _err(f"bad LTC_CACHE_* setting: {exc}")
        return USAGE
    directory = Path(args.dir).expanduser() if args.dir else config.directory
    try:
        store = open_store(directory, create=args.command == "import",
                           readonly=not _writes(args), max_size=config.max_size)
    except NoCache as exc:
        _err(f"{exc} (give --dir or set LTC_CACHE_DIR)")
        return USAGE
    except (OSError, sqlite3.Error) as exc:
        _err(f"cannot open the cache at {directory}: {exc}")
        return USAGE
    try:
        return args.run(args, store, config)
    except UsageError as exc:
        _err(str(exc))
        return USAGE
    except BrokenPipeError:  # `ltc-cache ls | head`: the reader has all it wants
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return PROBLEMS
    except (OSError, sqlite3.Error) as exc:
        _err(f"{type(exc).__name__}: {exc}")
        return PROBLEMS
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    finally:
        store.close()
