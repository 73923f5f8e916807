"""The commands of ``ltc-cache``, one function each, taking the parsed
arguments, the opened tier and the configuration and returning the exit
status; what they show comes from the report package."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config import CacheConfig
from ..counter_names import HITS, MISSES
from ..errors import EntryError
from ..kinds import EntryKind
from ..report import (
    STAT_LABELS,
    STAT_NAMES,
    DeletePlan,
    EntryFilter,
    EntryInfo,
    FusedInfo,
    KindTotal,
    collect_stats,
    describe_source,
    export_bundle,
    fused_info,
    import_bundle,
    load_entry,
    plan_clear,
    plan_prune,
    remove_free_lock_files,
    resolve_key,
    scan,
    signature_str,
    sort_entries,
    verify,
)
from ..report.remote import RemoteTier
from ..store.bundle import BundleError
from ..store.disk import DiskStore
from ..units import format_size
from .output import (
    OK,
    PROBLEMS,
    Progress,
    UsageError,
    confirm,
    counted,
    format_timestamp,
    print_error,
    print_json,
    print_line,
    table_lines,
)

_LIMIT_SOURCES = {
    "recorded": " (kept by the processes that store here: their LTC_CACHE_MAX_SIZE)",
    "environment": " (LTC_CACHE_MAX_SIZE here; no storing process recorded one)",
    None: "",
}


# Rows of a deletion plan shown before the totals.
_PLAN_ROWS = 50


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
    # Graphs are the rule; the column appears where there are other kinds
    # (negative entries: graphs LTC cannot extract, remembered as such).
    with_kind = any(e.kind not in (None, EntryKind.GRAPH) for e in good)
    headers = ["KEY", "NAME", *(["KIND"] if with_kind else []), "OPS", "INPUTS", "SIZE",
               "CREATED", "LAST USED", "HITS", "TORCH"]
    rows = [[e.short_key, e.graph_name, *([e.kind or EntryKind.GRAPH] if with_kind else []),
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
    (as ``ls`` shows its KIND column); a fused row splits libraries from
    refusals."""
    if all(total.kind == EntryKind.GRAPH for total in kinds):
        return []
    rows = []
    for total in kinds:
        text = f"{total.entries} ({total.size_str})"
        if total.parts:
            text += ": " + ", ".join(f"{counted(part.entries, part.kind)} ({part.size_str})"
                                     for part in total.parts)
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


def _find(entries: Sequence[EntryInfo], prefix: str) -> str:
    try:
        return resolve_key((e.key for e in entries), prefix)
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None
    except ValueError as exc:  # AmbiguousKey, or not hex
        raise UsageError(str(exc)) from None


def cmd_show(args: argparse.Namespace, store: DiskStore, config: CacheConfig) -> int:
    entries = scan(store).entries
    key = _find(entries, args.key)
    info = next(e for e in entries if e.key == key)
    try:
        entry = load_entry(store, key, secret=config.secret)
    except KeyError as exc:
        raise UsageError(exc.args[0]) from None
    except EntryError as exc:
        print_error(f"entry {key[:12]} cannot be read: {exc}")
        return PROBLEMS
    meta, payload = dict(entry.meta), dict(entry.payload)
    if entry.kind == EntryKind.PROGRAM:  # a pickle: its size here, never its bytes
        artifact = payload.pop("artifact", b"")
        payload["artifact_size"] = len(artifact) if isinstance(artifact, bytes) else None
        payload.pop("hmac", None)
    fused = None
    if entry.kind == EntryKind.FUSED:  # machine code: its size and digest here, never its bytes
        fused = fused_info(payload)
        payload.pop("library", None)
        payload.pop("hmac", None)
        payload["library_size"] = fused.library_size
    inputs = [describe_source(s) for s in entry.inputs]
    outputs = [describe_source(s) for s in entry.outputs]
    updates = [f"output {u.output} -> {describe_source(u.target)}" for u in entry.updates]
    if args.json:
        print_json({
            **info.as_dict(),
            "meta": meta, "payload": payload, "inputs": inputs, "outputs": outputs,
            "updates": updates, **({} if args.no_ir else {"ir": entry.ir}),
            **({} if fused is None else {"fused": fused.as_dict(), "signature":
                                         signature_str(entry, config.secret)}),
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
    if fused is not None:
        fields += _fused_fields(fused, signature_str(entry, config.secret), entries)
    else:
        fields += _payload_fields(entry.kind, payload)
    width = max(len(name) for name, _ in fields)
    lines = [f"{name:<{width}}  {value}" for name, value in fields]
    if entry.kind == EntryKind.GRAPH:
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
    print_line("\n".join(lines))
    return OK


def _payload_fields(kind: str, payload: dict[str, Any]) -> list[tuple[str, str]]:
    """What an entry of ``kind`` other than a graph holds, a line each (the
    whole of it: --json)."""
    if kind == EntryKind.NEGATIVE:
        return [("Reason", str(payload.get("reason", "?")))]
    if kind == EntryKind.PROGRAM:
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


def _fused_fields(fused: FusedInfo, signature: str, entries: Sequence[EntryInfo],
                  ) -> list[tuple[str, str]]:
    """A fused entry: the graph it belongs to, its library or why it has
    none, and how its compile went."""
    graph = next((e for e in entries if e.key == fused.graph_key), None)
    fields = [("Graph", f"{fused.graph_key} " + (f"({graph.graph_name})" if graph
                                                 else "(not stored here)"))]
    if fused.refused:
        fields.append(("Refused", str(fused.reason)))
    else:
        fields += [("Library", f"{fused.library_size_str}, sha256 {fused.library_sha256}"),
                   ("ISA", fused.isa_str)]
    if fused.compile_seconds is not None:
        fields.append(("Compiled in", fused.compile_seconds_str
                       + (f" by {fused.compiler}" if fused.compiler else "")))
    if fused.ratio is not None:
        fields.append(("Per call", fused.timing_str))
    fields.append(("Signature", signature))
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
    # A region is [name, graph, ops] or, with its key digest, [..., digest].
    graphs = [wire.get("graph")] + [r[1] for r in wire.get("regions") or ()
                                    if isinstance(r, list) and len(r) in (3, 4)]
    graphs = [g for g in graphs if isinstance(g, dict)]
    nodes = sum(len(g.get("nodes") or ()) for g in graphs)
    constants = sum(len(g.get("constants") or ()) for g in graphs)
    return (f"{nodes} nodes in {len(graphs) - 1} LTC regions and the eager rest, "
            f"{constants} tensor constants (the graphs: --json)")


_KINDS = {
    EntryKind.NEGATIVE: (
        "A negative entry: this graph (or program) could not be compiled (Reason above), "
        "so no process\ntries again; the graph is partitioned or runs eagerly, the "
        "program runs through torch.compile.\nIt holds no inputs, outputs or IR."),
    EntryKind.PLAN: (
        "A plan: AOTAutograd's graphs, split into LTC regions and an eager rest, as data "
        "(Plan above),\nwhich a warm process runs instead of running AOTAutograd and "
        "partitioning; its LTC regions'\ncompiled graphs are entries of their own. "
        "The graphs: --json."),
    EntryKind.PROGRAM: (
        "A program: what Dynamo captured of a function (ltc_cache.compile), signed, "
        "which a warm process\nloads instead of capturing; its graphs and plan are "
        "entries of their own."),
    EntryKind.FUSED: (
        "A fused entry: the graph above compiled ahead by AOTInductor into a shared "
        "library (signed),\nwhich a process of the same torch, compiler and CPU calls "
        "instead of its TorchScript function;\nor, refused, why the graph has none, so "
        "no process compiles it again (`ltc-cache fuse --retry` does).\nIt holds no "
        "inputs, outputs or IR."),
}


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
    if args.max_size is None and args.older_than is None and not args.stale:
        raise UsageError("prune what? give --max-size, --older-than and/or --stale")
    plan = plan_prune(scan(store), max_size=args.max_size, older_than=args.older_than,
                      stale=args.stale)
    return _run_plan(plan, store, args)


def cmd_clear(args: argparse.Namespace, store: DiskStore, config: CacheConfig) -> int:
    return _run_plan(plan_clear(scan(store)), store, args)


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
        wanted = {_find(scanned, p) for p in prefixes}
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
