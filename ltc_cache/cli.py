"""``ltc-cache``: look after a cache directory and the Redis tier under it.

    ltc-cache [--dir DIR] [--remote URL | --local] ls | stats | show KEY | prune
                          | clear | verify | export FILE | import FILE

The tier options work before or after the command. The directory is
``--dir``, else the library's; Redis is included with ``--remote`` or
LTC_CACHE_REMOTE (``--remote`` without ``--dir``: Redis alone).

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
from typing import Any, NoReturn, TextIO

from .config import CacheConfig
from .errors import EntryError
from .report import (
    SORT_FIELDS,
    STAT_LABELS,
    STAT_NAMES,
    DeletePlan,
    EntryFilter,
    EntryInfo,
    collect_stats,
    describe_source,
    export_bundle,
    import_bundle,
    load_entry,
    parse_filter,
    plan_clear,
    plan_prune,
    remove_free_lock_files,
    resolve_key,
    scan,
    sort_entries,
    verify,
)
from .report.remote import RemoteTier
from .store.bundle import BundleError
from .store.disk import DiskStore
from .store.tiers import NoCache, open_directory
from .units import SIZE_RULE, format_size, parse_age, parse_size

__all__ = ["main"]

OK, PROBLEMS, USAGE = 0, 1, 2
_LIMIT_SOURCES = {
    "recorded": " (kept by the processes that store here: their LTC_CACHE_MAX_SIZE)",
    "environment": " (LTC_CACHE_MAX_SIZE here; no storing process recorded one)",
    None: "",
}
# Rows of a deletion plan shown before the totals.
_PLAN_ROWS = 50


class UsageError(Exception):
    """Bad input on the command line: exit status 2."""


def _out(text: str = "") -> None:
    sys.stdout.write(text + "\n")


def _err(text: str) -> None:
    sys.stderr.write(f"ltc-cache: {text}\n")


# Set when one command covers two tiers with --json: each tier's object is
# kept under its name and printed as one.
_json_sink: dict[str, Any] | None = None


def _json(obj: Any) -> None:
    if _json_sink is not None:
        _json_sink[_json_sink["current"]] = obj
        return
    # Indented for a person at a terminal; compact for a program, since the
    # json module's C encoder is used only without indentation (5x faster
    # on a 10,000-entry listing).
    indent = 2 if sys.stdout.isatty() else None
    _out(json.dumps(obj, indent=indent, default=str))


def _n(count: int, noun: str) -> str:
    """``1 entry``, ``2 entries``, ``0 internal records``."""
    if count == 1:
        return f"1 {noun}"
    return f"{count} {noun[:-1] + 'ies' if noun.endswith('y') else noun + 's'}"


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
    total = f"{len(shown)}{of} {_n(len(report.entries), 'entry').split(' ', 1)[1]}, " \
            f"{format_size(size)}, {_n(hits, 'hit')}"
    bad = len(shown) - len(good)
    if bad:
        total += f"; {bad} unreadable (see `ltc-cache verify`)"
    lines.append(total if rows or bad else f"No entries{' match' if of else ''} in "
                 f"{report.directory}.")
    _out("\n".join(lines))
    return OK


def _cmd_stats(args: argparse.Namespace, store: DiskStore, config: CacheConfig) -> int:
    if isinstance(store, RemoteTier):
        return _remote_stats(args, store)
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
        ("Size limit", stats.size_limit_str + _LIMIT_SOURCES[stats.size_limit_source]),
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


def _remote_stats(args: argparse.Namespace, tier: RemoteTier) -> int:
    if args.zero:
        raise UsageError("Redis keeps no counters to zero: each cache directory keeps its own")
    stats = collect_stats(tier)
    if args.json:
        _json(stats.as_dict())
        return OK
    rows = [
        ("Redis", str(tier.directory).removeprefix("redis ")),
        ("Entries", f"{stats.entries} ({stats.entry_size_str})"),
        ("Internal records", f"{stats.internal_records} ({stats.internal_size_str})"),
        ("Counters", "none here: each cache directory keeps those of the processes using it"),
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
    meta, payload = dict(entry.meta), dict(entry.payload)
    if entry.kind == "program":  # a pickle: its size here, never its bytes
        artifact = payload.pop("artifact", b"")
        payload["artifact_size"] = len(artifact) if isinstance(artifact, bytes) else None
        payload.pop("hmac", None)
    inputs = [describe_source(s) for s in entry.inputs]
    outputs = [describe_source(s) for s in entry.outputs]
    updates = [f"output {u.output} -> {describe_source(u.target)}" for u in entry.updates]
    if args.json:
        _json({
            **info.as_dict(),
            "meta": meta, "payload": payload, "inputs": inputs, "outputs": outputs,
            "updates": updates, **({} if args.no_ir else {"ir": entry.ir}),
        })
        return OK
    fields = [
        ("Key", key),
        ("Name", entry.graph_name),
        ("Kind", entry.kind),
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
               if name not in {"graph_name", "node_count", "created", "torch_version",
                               "graph_hash", "key_parts"}]
    fields += _payload_fields(entry.kind, payload)
    width = max(len(name) for name, _ in fields)
    lines = [f"{name:<{width}}  {value}" for name, value in fields]
    if entry.kind == "graph":
        lines += ["", f"Inputs ({len(inputs)}), in graph parameter order:"]
        lines += [f"  %p{i:<4} {text}" for i, text in enumerate(inputs)]
        lines += ["", f"Outputs ({len(outputs)}):"]
        lines += [f"  {i:<5} {text}" for i, text in enumerate(outputs)]
        if updates:
            lines += ["", f"In-place updates ({len(updates)}):", *(f"  {u}" for u in updates)]
        if not args.no_ir:
            lines += ["", "IR:", *(f"  {line}" for line in (entry.ir or "(empty)").splitlines())]
    else:
        # Neither holds a replayable graph: no inputs, outputs or IR to show.
        lines += ["", _KINDS[entry.kind]]
    _out("\n".join(lines))
    return OK


def _payload_fields(kind: str, payload: dict[str, Any]) -> list[tuple[str, str]]:
    """What an entry of ``kind`` other than a graph holds, a line each (the
    whole of it: --json)."""
    if kind == "negative":
        return [("Reason", str(payload.get("reason", "?")))]
    if kind == "program":
        frames = payload.get("frames")
        if isinstance(frames, dict):  # a function Dynamo compiles as several frames
            return _frames_fields(payload, frames)
        return [("Program", f"{len(payload.get('sources') or ())} inlined sources, "
                            f"{len(payload.get('checks') or ())} portable checks, "
                            f"{format_size(payload.get('artifact_size') or 0)} "
                            f"artifact (signed; the rest: --json)")]
    fields = [(label, _partitioned_summary(payload[name]))
              for label, name in (("Plan", "plan"), ("Backward", "backward"))
              if isinstance(payload.get(name), dict)]
    joint = payload.get("joint")
    if isinstance(joint, dict):  # a training plan's layout
        fields.append(("Joint", f"{joint.get('outputs')} outputs, "
                                f"{joint.get('saved')} + {joint.get('saved_unchecked')} "
                                f"saved tensors, {len(joint.get('tangents') or ())} tangents"))
    return fields


def _frames_fields(payload: dict[str, Any], frames: dict[str, Any]) -> list[tuple[str, str]]:
    """A program of several frames: each code object Dynamo compiled (the
    function, its resume functions, the user code it did not inline), with
    how many compiled frames it holds, and the graph-break reasons."""
    codes = [c for c in frames.get("codes") or () if isinstance(c, list) and len(c) == 4]
    fields = [("Program", f"{sum(int(c[3]) for c in codes)} frames in {len(codes)} code "
                          f"objects, {len(payload.get('sources') or ())} inlined sources, "
                          f"{len(payload.get('checks') or ())} frames with portable checks, "
                          f"{format_size(payload.get('artifact_size') or 0)} artifact "
                          f"(signed; the rest: --json)")]
    fields += [(f"Frames {i}", f"{qualname} ({Path(str(filename)).name}:{line}): "
                               f"{guarded} compiled")
               for i, (qualname, filename, line, guarded) in enumerate(codes)]
    fields += [("Graph break", f"{reason}" + (f" (x{count})" if count != 1 else ""))
               for reason, count in frames.get("breaks") or ()]
    return fields


def _partitioned_summary(wire: dict[str, Any]) -> str:
    """A partitioned graph of a plan in a line (its nodes: --json)."""
    graphs = [wire.get("graph")] + [r[1] for r in wire.get("regions") or ()
                                    if isinstance(r, list) and len(r) == 3]
    graphs = [g for g in graphs if isinstance(g, dict)]
    nodes = sum(len(g.get("nodes") or ()) for g in graphs)
    constants = sum(len(g.get("constants") or ()) for g in graphs)
    return (f"{nodes} nodes in {len(graphs) - 1} LTC regions and the eager rest, "
            f"{constants} tensor constants (the graphs: --json)")


_KINDS = {
    "negative": "A negative entry: this graph (or program) could not be compiled (Reason above), "
                "so no process\ntries again; the graph is partitioned or runs eagerly, the "
                "program runs through torch.compile.\nIt holds no inputs, outputs or IR.",
    "plan": "A plan: AOTAutograd's graphs, split into LTC regions and an eager rest, as data "
            "(Plan above),\nwhich a warm process runs instead of running AOTAutograd and "
            "partitioning; its LTC regions'\ncompiled graphs are entries of their own. "
            "The graphs: --json.",
    "program": "A program: what Dynamo captured of a function (ltc_cache.compile), signed, "
               "which a warm process\nloads instead of capturing; its graphs and plan are "
               "entries of their own.",
}


def _print_plan(plan: DeletePlan) -> None:
    rows = [[e.short_key, e.graph_name, e.size_str, e.last_used_str, plan.reasons[e.key]]
            for e in plan.entries[:_PLAN_ROWS]]
    if rows:
        _out("\n".join(_table(["KEY", "NAME", "SIZE", "LAST USED", "WHY"], rows, right={2})))
    if len(plan.entries) > _PLAN_ROWS:
        _out(f"… and {len(plan.entries) - _PLAN_ROWS} more")
    records = f" and {_n(len(plan.records), 'internal record')}" if plan.records else ""
    _out(f"Will delete {_n(len(plan.entries), 'entry')}{records}, "
         f"freeing {plan.expected_freed_size_str}.")


def _run_plan(plan: DeletePlan, store: DiskStore, args: argparse.Namespace) -> int:
    if not plan.entries and not plan.records:
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
    records = f" and {_n(len(plan.records), 'internal record')}" if plan.records else ""
    _out(f"Deleted {_n(removed, 'entry')}{records}, freed {plan.expected_freed_size_str}.")
    if plan.records and isinstance(store, DiskStore):  # a clear: the lock files too
        locks = remove_free_lock_files(store.directory)
        if locks:
            _out(f"Removed {_n(locks, 'lock file')} no process held.")
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
        summary = f"Checked {_n(result.checked, 'entry')}: {len(result.problems)} bad"
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
    path = Path(args.file)
    if path.is_dir():
        raise UsageError(f"{path} is a directory; give the bundle file to write, "
                         f"e.g. {path / 'cache.ltcb'}")
    if not path.parent.is_dir():
        raise UsageError(f"no directory {path.parent} to write {path.name} in")
    if path.exists() and not args.force:
        raise UsageError(f"{path} exists; give --force to overwrite it")
    entries, unreadable = _select(store, args.filter, args.key)
    with _Progress("exporting", len(entries)) as progress:
        written = export_bundle(store, [e.key for e in entries], path, progress=progress)
    size = sum(e.size for e in entries)
    _out(f"Exported {_n(written, 'entry')} ({format_size(size)}) to {path}.")
    if unreadable:
        _out(f"Left out {_n(unreadable, 'unreadable entry')} (see `ltc-cache verify`).")
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
    _out(f"Imported {_n(len(result.added), 'entry')} into {store.directory}; "
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


class _Parser(argparse.ArgumentParser):
    """A usage error is one line (and exit 2), not the whole usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _global_options(parser: argparse.ArgumentParser, default: Any) -> None:
    # On the main parser and on every command, so they work before or after
    # it (`ltc-cache show KEY --dir X`); a command's copy leaves the value
    # alone unless given there.
    parser.add_argument("--dir", metavar="DIR", default=default,
                        help="cache directory (default: LTC_CACHE_DIR, else the user cache dir)")
    parser.add_argument("--remote", metavar="URL", default=default,
                        help="the Redis tier too (default: LTC_CACHE_REMOTE); alone, without "
                        "--dir, the Redis tier only")
    parser.add_argument("--local", action="store_true", default=default,
                        help="the cache directory only, even with LTC_CACHE_REMOTE set")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ltc-cache",
        description="Inspect and maintain an ltc_cache directory of compiled LTC graphs, "
                    "and the Redis tier under it.",
        epilog=f"Sizes: {SIZE_RULE}. Ages: seconds, or a number with s, m, h, d, w or y. "
               "Exit status: 0 fine, 1 problems found, 2 usage error.")
    _global_options(parser, None)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run: Callable[..., int], help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        _global_options(sub, argparse.SUPPRESS)
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
                       help="delete least recently used entries until the rest fit in SIZE "
                       "(0: all of them), e.g. 2GB")
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
    export.add_argument("--force", "-f", action="store_true", help="overwrite an existing FILE")
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


# Commands that work on one tier: the directory where there is one.
_ONE_TIER = ("show", "export", "import")


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
        if args.command == "import" and tiers[0][0] == "remote":
            raise UsageError("import adds to a cache directory; give --dir (the library "
                             "copies entries to Redis as it stores them)")
        tiers = tiers[:1]
    return tiers


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
        _err(str(exc))
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
    finally:
        store.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = CacheConfig.from_env(strict=True)
    except ValueError as exc:
        _err(f"bad setting: {exc}")
        return USAGE
    try:
        tiers = _tiers(args, config)
    except UsageError as exc:
        _err(str(exc))
        return USAGE
    global _json_sink
    if len(tiers) > 1 and getattr(args, "json", False):
        _json_sink = {}  # one JSON object, a member per tier
    status = OK
    try:
        for index, (kind, where) in enumerate(tiers):
            if len(tiers) > 1 and _json_sink is None:
                _out(("" if index == 0 else "\n") + ("== cache directory ==" if kind == "local"
                                                     else "== Redis tier =="))
            if _json_sink is not None:
                _json_sink["current"] = kind
            code = _run_tier(args, config, kind, where)
            if code == USAGE:
                return USAGE
            status = max(status, code)
    except KeyboardInterrupt:
        _err("interrupted")
        return 130
    finally:
        if _json_sink is not None:
            sink, _json_sink = _json_sink, None
            sink.pop("current", None)
            _json(sink)
    return status
