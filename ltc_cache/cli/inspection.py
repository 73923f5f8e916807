"""The commands that look at a cache: ``ls``, ``stats``, ``show`` and
``verify``, one function each, taking the parsed arguments, the opened tier
and the configuration and returning the exit status. What they show comes
from the report package; what an entry of each kind shows and how it is
verified, from its kind's registration (entries/kind_registry.py)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from ..config import CacheConfig
from ..counter_names import HITS, MISSES
from ..entries.kinds import EntryKind
from ..errors import EntryError, UsageError
from ..report import (
    STAT_LABELS,
    STAT_NAMES,
    EntryInfo,
    KindTotal,
    collect_stats,
    describe_source,
    kind_view,
    load_entry,
    resolve_key,
    scan,
    sort_entries,
    verify,
)
from ..report.remote import RemoteTier
from ..store.disk import DiskStore
from ..units import format_size
from .output import (
    OK,
    PROBLEMS,
    Progress,
    counted,
    format_timestamp,
    print_error,
    print_json,
    print_line,
    table_lines,
)

__all__ = ["cmd_ls", "cmd_show", "cmd_stats", "cmd_verify", "find_key"]

_LIMIT_SOURCES = {
    "recorded": " (kept by the processes that store here: their LTC_CACHE_MAX_SIZE)",
    "environment": " (LTC_CACHE_MAX_SIZE here; no storing process recorded one)",
    None: "",
}


def cmd_ls(args: argparse.Namespace, store: DiskStore, config: CacheConfig) -> int:
    report = scan(store)
    now = time.time()
    shown = [e for e in report.entries if all(f(e, now) for f in args.filter)]
    shown = sort_entries(shown, args.sort, reverse=args.reverse)
    size, hits = sum(e.size for e in shown), sum(e.hits for e in shown)
    if args.json:
        print_json({
            "directory": str(report.directory),
            "entries": [e.as_dict() for e in shown],
            "total": {"entries": len(shown), "size": size, "hits": hits,
                      "unreadable": sum(1 for e in shown if e.problem)},
            "internal_records": {"count": report.internal_records,
                                 "size": report.internal_size},
        })
        return OK
    good = [e for e in shown if not e.problem]
    # Graphs are the rule (an entry without a kind is one); the column
    # appears where there are entries of other kinds.
    with_kind = any(e.kind not in (None, EntryKind.GRAPH) for e in good)
    headers = ["KEY", "NAME", *(["KIND"] if with_kind else []), "OPS", "INPUTS", "SIZE",
               "CREATED", "LAST USED", "HITS", "TORCH"]
    rows = [[e.short_key, e.graph_name, *([e.kind_str] if with_kind else []),
             str(e.node_count), str(e.num_inputs), e.size_str, e.created_str,
             e.last_used_str, str(e.hits), e.torch_version] for e in good]
    first_number = 3 if with_kind else 2
    lines = table_lines(headers, rows, right=set(range(first_number, first_number + 3))
                        | {len(headers) - 2}) if rows else []
    lines += [f"! {e.short_key}  {e.size_str}  {e.problem}" for e in shown if e.problem]
    of = f" of {len(report.entries)}" if len(shown) != len(report.entries) else ""
    total = f"{len(shown)}{of} {counted(len(report.entries), 'entry').split(' ', 1)[1]}, " \
            f"{format_size(size)}, {counted(hits, 'hit')}"
    bad = len(shown) - len(good)
    if bad:
        total += f"; {bad} unreadable (see `ltc-cache verify`)"
    lines.append(total if rows or bad else f"No entries{' match' if of else ''} in "
                 f"{report.directory}.")
    print_line("\n".join(lines))
    return OK


def cmd_stats(args: argparse.Namespace, store: DiskStore, config: CacheConfig) -> int:
    if isinstance(store, RemoteTier):
        return _remote_stats(args, store)
    if args.zero:
        store.ledger.zero()
        print_line(f"Statistics of {store.directory} zeroed.")
        return OK
    stats = collect_stats(store, size_limit=config.max_size)
    if args.json:
        print_json(stats.as_dict())
        return OK
    c = stats.counters
    rows = [
        ("Cache directory", str(stats.directory)),
        ("Entries", f"{stats.entries} ({stats.entry_size_str})"),
        *_kind_rows(stats.kinds),
        ("Internal records", f"{stats.internal_records} ({stats.internal_size_str})"),
        ("Disk usage", stats.disk_usage_str),
        ("Size limit", stats.size_limit_str + _LIMIT_SOURCES[stats.size_limit_source]),
        ("Hits", str(c[HITS])),
        ("Misses", str(c[MISSES])),
        ("Hit rate", stats.hit_rate_str),
        *((STAT_LABELS.get(name, name.capitalize()), str(c[name])) for name in STAT_NAMES
          if name not in (HITS, MISSES)),
        ("Counting since", "first use" if stats.zeroed_at is None
         else f"{stats.zeroed_at_str} (stats --zero)"),
    ]
    width = max(len(name) for name, _ in rows)
    print_line("\n".join(f"{name:<{width}}  {value}" for name, value in rows))
    return OK


def _kind_rows(kinds: Sequence[KindTotal]) -> list[tuple[str, str]]:
    """A row per kind under Entries, where there are kinds besides graphs
    (as ``ls`` shows its KIND column), split into the parts its kind
    counts apart (a fused row: libraries, libraries for other CPUs and
    refusals), those it has."""
    if all(total.kind == EntryKind.GRAPH for total in kinds):
        return []
    rows = []
    for total in kinds:
        text = f"{total.entries} ({total.size_str})"
        if total.parts:
            text += ": " + ", ".join(f"{counted(part.entries, part.kind)} ({part.size_str})"
                                     for part in total.parts if part.entries)
        rows.append((f"  {total.kind}", text))
    return rows


def _remote_stats(args: argparse.Namespace, tier: RemoteTier) -> int:
    if args.zero:
        raise UsageError("Redis keeps no counters to zero: each cache directory keeps its own")
    stats = collect_stats(tier)
    if args.json:
        print_json(stats.as_dict())
        return OK
    rows = [
        ("Redis", str(tier.directory).removeprefix("redis ")),
        ("Entries", f"{stats.entries} ({stats.entry_size_str})"),
        ("Internal records", f"{stats.internal_records} ({stats.internal_size_str})"),
        ("Counters", "none here: each cache directory keeps those of the processes using it"),
    ]
    width = max(len(name) for name, _ in rows)
    print_line("\n".join(f"{name:<{width}}  {value}" for name, value in rows))
    return OK


def find_key(entries: Sequence[EntryInfo], prefix: str) -> str:
    """The key of the one entry of ``entries`` that ``prefix`` names;
    UsageError where none or several do."""
    try:
        return resolve_key((e.key for e in entries), prefix)
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None
    except ValueError as exc:  # AmbiguousKey, or not hex
        raise UsageError(str(exc)) from None


def cmd_show(args: argparse.Namespace, store: DiskStore, config: CacheConfig) -> int:
    entries = scan(store).entries
    key = find_key(entries, args.key)
    info = next(e for e in entries if e.key == key)
    try:
        entry = load_entry(store, key, secret=config.secret)
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None
    except EntryError as exc:
        print_error(f"entry {key[:12]} cannot be read: {exc}")
        return PROBLEMS
    meta = dict(entry.meta)
    view = kind_view(entry, entries, secret=config.secret, with_ir=not args.no_ir)
    if args.json:
        print_json({
            **info.as_dict(),
            "meta": meta, "payload": dict(view.payload),
            "inputs": [describe_source(s) for s in entry.inputs],
            "outputs": [describe_source(s) for s in entry.outputs],
            "updates": [f"output {u.output} -> {describe_source(u.target)}"
                        for u in entry.updates],
            **({} if args.no_ir else {"ir": entry.ir}), **view.json,
        })
        return OK
    fields = [
        ("Key", key),
        ("Name", entry.graph_name),
        ("Kind", entry.kind),
        ("Ops", str(meta.get("node_count", "?"))),
        ("Size", info.size_str),
        ("Created", f"{format_timestamp(entry.created)} ({info.created_str})"),
        ("Last used", f"{format_timestamp(info.last_used)} ({info.last_used_str})"),
        ("Hits", str(info.hits)),
        ("Torch", str(meta.get("torch_version", "?"))),
        ("Graph hash", str(meta.get("graph_hash", "?"))),
    ]
    fields += [(f"Key part {name}", value[:16])
               for name, value in sorted(dict(meta.get("key_parts") or {}).items())]
    fields += [(name, str(value)) for name, value in sorted(meta.items())
               if name not in {"graph_name", "node_count", "created", "torch_version",
                               "graph_hash", "key_parts"}]
    fields += view.fields
    width = max(len(name) for name, _ in fields)
    print_line("\n".join([*(f"{name:<{width}}  {value}" for name, value in fields),
                          *view.lines]))
    return OK


def cmd_verify(args: argparse.Namespace, store: DiskStore, config: CacheConfig) -> int:
    keys = [e.key for e in scan(store).entries]
    with Progress("verifying", len(keys)) as progress:
        result = verify(store, keys, secret=config.secret, progress=progress)
    removed = store.discard([p.key for p in result.problems]) if args.fix else []
    if args.json:
        print_json({"checked": result.checked,
                    "problems": [{"key": p.key, "problem": p.problem} for p in result.problems],
                    "removed": removed})
    else:
        for p in result.problems:
            print_line(f"BAD {p.key[:12]}  {p.problem}")
        summary = f"Checked {counted(result.checked, 'entry')}: {len(result.problems)} bad"
        summary += f", {len(removed)} removed." if args.fix else "."
        if result.problems and not args.fix:
            summary += " `ltc-cache verify --fix` removes them."
        print_line(summary)
    return OK if len(removed) == len(result.problems) else PROBLEMS

