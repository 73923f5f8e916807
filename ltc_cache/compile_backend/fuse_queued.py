"""What the background worker compiles, in what order, and side by side.

A training step's plan is queued beside each of its regions, and a plan's
whole-graph library, kept with its verdict, runs in place of all of them:
a process that has it never runs the plan's regions. So the worker
compiles the queued plans first, and takes a region off the queue
uncompiled where a library of the plan part it belongs to is stored: a
small GPT's step is then two compiles (its forward and its backward)
rather than a dozen, whatever its layer count. A region whose plan part
was refused is compiled after, once for each distinct region: identical
layers' regions share one library (graph/fused/source.py), so a 12-layer
model's regions are as many compiles as a 4-layer model's. A process that
runs a skipped region anyway (its plan library refused on first use)
queues it again.

Several compile processes may drain one queue side by side (the worker
starts one a core while its clients are idle): each job (a plan's part, a
graph) is claimed by a lock file that the kernel lets go with its process,
so no job is compiled twice and none is stranded by a compile that died.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from ..entries.keys import CacheKey
from ..entries.kinds import EntryKind
from ..graph.fused.platform import fused_key, source_key
from .plan_library import fuse_plan_part, fuse_stored, part_key, plan_part_graph, plan_parts

if TYPE_CHECKING:
    from ..entries.entry import Entry
    from ..graph.cache import GraphCache
    from ..graph.fused.queue import FuseQueue

__all__ = ["fuse_queued"]

logger = logging.getLogger(__name__)

# How long a compile process waits before it looks again for a job that
# another one holds (or one whose plan another is compiling).
_WAIT_SECONDS = 0.5


def fuse_queued(cache: GraphCache, queue: FuseQueue, *, timeout: float | None = None) -> None:
    """Compile what ``queue`` holds until it is empty, plans first; each
    key taken off once its fused entries are stored (or it is skipped)."""
    entries: dict[str, Entry | None] = {}  # each queued entry read once, however many passes
    jobs: dict[str, str] = {}  # and what its compile is claimed by, worked out once
    while keys := queue.pending():
        for key in keys:
            if key not in entries:
                entries[key] = cache.lookup_entry(CacheKey(key, {}), count=False)
                jobs[key] = _job(entries[key], key)
        plans = [entries[k] for k in keys
                 if entries[k] is not None and entries[k].kind == EntryKind.PLAN]
        # Every plan this process has met covers its regions, queued or not:
        # another compile process takes a plan off the queue once it has
        # stored the plan's libraries, and its regions are still to be
        # passed over here.
        met = [e for e in entries.values() if e is not None and e.kind == EntryKind.PLAN]
        did = False
        for plan in plans:
            tried = set()  # parts this process compiled: stored, or failing to store
            for part in plan_parts(plan):
                with queue.claimed(f"{plan.key}.{part}") as mine:
                    if mine and not _stored(cache, part_key(plan.key, part)):
                        fuse_plan_part(cache, plan, part, timeout=timeout)
                        tried.add(part)
                        did = True
            if all(part in tried or _stored(cache, part_key(plan.key, part))
                   for part in plan_parts(plan)):
                queue.done(plan.key)
        if any(plan.key in queue.pending() for plan in plans):
            if not did:  # another process compiles them: the regions wait for its verdict
                time.sleep(_WAIT_SECONDS)
            continue
        covered = set().union(*(_covered_regions(cache, plan) for plan in met))
        for key in keys:
            entry = entries[key]
            if entry is not None and entry.kind == EntryKind.PLAN:
                continue
            with queue.claimed(jobs[key]) as mine:
                if not mine or not queue.queued(key):  # another process's, or done by one
                    continue
                if entry is not None and _region_digest(entry) in covered:
                    logger.info("%s (%s): its plan's library runs it; not compiled",
                                entry.graph_name, key[:12])
                else:
                    fuse_stored(cache, key, timeout=timeout)
                    did = True
                queue.done(key)
        if not did:
            time.sleep(_WAIT_SECONDS)


def _job(entry: Entry | None, key: str) -> str:
    """What compiling the queued ``key`` is claimed by: a graph's library
    key, which identical layers share, so no two processes compile one
    library side by side (the second finds it stored)."""
    return fused_key(source_key(entry)).digest if entry is not None \
        and entry.kind == EntryKind.GRAPH else key


def _stored(cache: GraphCache, key: CacheKey) -> bool:
    return cache.lookup_entry(key, count=False) is not None


def _covered_regions(cache: GraphCache, plan: Entry) -> set[str]:
    """The digests of the regions of ``plan``'s parts whose library is stored."""
    digests: set[str] = set()
    for part in plan_parts(plan):
        stored = cache.lookup_entry(part_key(plan.key, part), count=False)
        if stored is None or "library" not in stored.payload:
            continue
        try:
            parted = plan_part_graph(plan, part)
        except Exception as exc:  # an unreadable plan: its regions are compiled
            logger.debug("plan %s: %s", plan.key[:12], exc)
            continue
        for region in parted.regions:
            digest = getattr(parted.module.get_submodule(region), "digest", None)
            if isinstance(digest, str):
                digests.add(digest)
    return digests


def _region_digest(entry: Entry) -> str | None:
    """The graph digest a graph entry was keyed by (a plan's region's)."""
    parts = entry.meta.get("key_parts")
    return parts.get("graph") if isinstance(parts, dict) else None
