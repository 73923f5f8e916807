"""What the background worker compiles, and in what order: plans first,
then only the regions their libraries do not cover.

A training step's plan is queued beside each of its regions, and a plan's
whole-graph library, kept with its verdict, runs in place of all of them:
a process that has it never runs the plan's regions. So the worker
compiles the queued plans first, and takes a region off the queue
uncompiled where a library of the plan part it belongs to is stored: a
small GPT's step is then two compiles (its forward and its backward)
rather than a dozen, whatever its layer count. A region whose plan part
was refused is compiled as before; a process that runs a skipped region
anyway (its plan library refused on first use) queues it again.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..graph.keys import CacheKey
from ..kinds import EntryKind
from .plan_library import fuse_stored, part_key, plan_part_graph, plan_parts

if TYPE_CHECKING:
    from ..graph.cache import GraphCache
    from ..graph.entry import Entry
    from ..graph.fused.queue import FuseQueue

__all__ = ["fuse_queued"]

logger = logging.getLogger(__name__)


def fuse_queued(cache: GraphCache, queue: FuseQueue, *, timeout: float | None = None) -> None:
    """Compile what ``queue`` holds until it is empty, plans first; each
    key taken off once its fused entry is stored (or it is skipped)."""
    while keys := queue.pending():
        entries = {key: cache.lookup_entry(CacheKey(key, {}), count=False) for key in keys}
        plans = [k for k in keys if entries[k] is not None and entries[k].kind == EntryKind.PLAN]
        covered: set[str] = set()
        for key in plans:
            fuse_stored(cache, key, timeout=timeout)
            covered |= _covered_regions(cache, entries[key])
            queue.done(key)
        for key in keys:
            entry = entries[key]
            if key in plans:
                continue
            if entry is not None and _region_digest(entry) in covered:
                logger.info("%s (%s): its plan's library runs it; not compiled",
                            entry.graph_name, key[:12])
            else:
                fuse_stored(cache, key, timeout=timeout)
            queue.done(key)


def _covered_regions(cache: GraphCache, plan: Entry | None) -> set[str]:
    """The digests of the regions of ``plan``'s parts whose library is stored."""
    if plan is None:
        return set()
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
