"""``ltc-cache fuse``: compile the fused libraries of stored graphs ahead.
What ``show`` and ``verify`` say of a fused entry is its kind's
(ltc_cache/graph/fused/fused_kind.py).

torch is imported inside the calls that compile, key or decode, never at
import: ``ls`` and ``stats`` import this package.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..entries.kind_registry import handlers_of
from ..entries.kinds import EntryKind
from ..errors import EntryError, WrongType
from ..graph.fused.fused_kind import FusedInfo, fused_info
from ..signing import program_secret
from ..store.disk import DiskStore
from .listing import EntryInfo

if TYPE_CHECKING:
    from ..entries.entry import Entry
    from ..graph.cache import GraphCache

__all__ = ["FuseOutcome", "FuseTarget", "fuse_one", "plan_fuse"]

# What fuse_one did with a graph (FuseOutcome.status).
LIBRARY, REFUSED = "library", "refused"
ALREADY_FUSED, ALREADY_REFUSED = "already fused", "already refused"
GONE, NOT_STORED = "gone", "not stored"


@dataclass(frozen=True)
class FuseTarget:
    """A graph entry ``fuse`` selected, and what is stored of its fused
    entry on this machine: ``"library"``, ``"refusal"`` or None."""

    graph: EntryInfo
    fused_key: str
    stored: str | None

    def compiles(self, retry: bool) -> bool:
        """Whether ``fuse`` (with ``retry``) would compile it."""
        return self.stored is None or (retry and self.stored == "refusal")


def plan_fuse(selected: Sequence[EntryInfo], every: Sequence[EntryInfo]
              ) -> tuple[FuseTarget, ...]:
    """The entries among ``selected`` of a kind that fuses (graphs, and
    plans: their whole graphs), each with the fused entry ``every`` (the
    whole listing) holds under its fused key on this machine; from the
    listing alone, nothing decoded."""
    from ..graph.fused.platform import fused_key

    fused = {e.key: e.fused or "library" for e in every if e.kind == EntryKind.FUSED}
    targets = []
    for graph in selected:
        handled = handlers_of(graph.kind)
        if handled is None or not handled.fuses or graph.problem:
            continue
        # A graph's library is keyed by its content (one an identical layer
        # compiled is this graph's too); a plan's by the plan's key.
        key = fused_key(graph.source or graph.key).digest
        targets.append(FuseTarget(graph, key, fused.get(key)))
    return tuple(targets)


@dataclass(frozen=True)
class FuseOutcome:
    """What ``fuse`` did with one graph: ``status`` is ``library`` or
    ``refused`` (compiled now), ``already fused`` or ``already refused``
    (stored before: skipped), ``gone`` (the graph entry was deleted, or
    could not be read), or ``not stored`` (compiled, but the store failed)."""

    graph_key: str
    graph_name: str
    status: str
    info: FusedInfo | None
    seconds: float  # what this run spent on it
    replaced: str | None = None  # why a stored library was deleted and compiled again

    @property
    def compiled(self) -> bool:
        return self.status in (LIBRARY, REFUSED, NOT_STORED)

    @property
    def summary_str(self) -> str:
        """The rest of the graph's line after its name and key."""
        info = self.info
        if self.status == LIBRARY and info is not None:
            text = f"library, compiled in {info.compile_seconds_str}"
            text += f", {info.timing_str}" if info.ratio is not None else ""
        elif self.status == REFUSED and info is not None:
            text = f"refused: {info.reason}"
        elif self.status == ALREADY_REFUSED and info is not None:
            text = f"already refused: {info.reason} (--retry compiles it again)"
        elif self.status == GONE:
            text = "skipped: the graph entry is no longer stored, or cannot be read"
        elif self.status == NOT_STORED:
            text = "compiled, but could not be stored (see the warning above)"
        else:
            text = self.status
        if self.replaced:
            text += f" (replaced a bad stored library: {self.replaced})"
        return text


def fuse_one(cache: GraphCache, graph_key: str, graph_name: str, *, retry: bool = False,
             timeout: float | None = None) -> FuseOutcome:
    """Compile and store the fused library of the graph entry
    ``graph_key`` (or the plan's libraries) with
    :func:`~ltc_cache.compile_backend.plan_library.fuse_stored`,
    unless one is stored already (``retry``: a refusal is compiled again).
    A stored library whose signature does not hold here is deleted and
    compiled again: no process here would ever load it."""
    from ..compile_backend.plan_library import fuse_stored
    from ..entries.keys import CacheKey
    from ..graph.fused.platform import fused_key, source_key

    store = cache.store
    if not isinstance(store, DiskStore):
        raise WrongType("fuse_one needs a GraphCache over a cache directory")
    started = time.monotonic()
    graph = cache.lookup_entry(CacheKey(graph_key, {}), count=False)
    if graph is None:
        return FuseOutcome(graph_key, graph_name, GONE, None, time.monotonic() - started)
    source = source_key(graph)
    key = fused_key(source)
    stored = cache.lookup_entry(key, count=False)
    replaced = None
    if stored is not None:
        replaced = _unusable(cache, stored, source)
        if replaced is None and ("library" in stored.payload or not retry):
            status = ALREADY_FUSED if "library" in stored.payload else ALREADY_REFUSED
            return FuseOutcome(graph_key, graph_name, status, fused_info(stored.payload),
                               time.monotonic() - started)
        if replaced is not None:
            store.discard([key.digest])
    entry = fuse_stored(cache, graph_key, retry=retry, timeout=timeout)
    seconds = time.monotonic() - started
    if entry is None:
        return FuseOutcome(graph_key, graph_name, GONE, None, seconds, replaced)
    status = LIBRARY if "library" in entry.payload else REFUSED
    if store.peek(key.digest) is None:  # GraphCache warns and carries on
        status = NOT_STORED
    return FuseOutcome(graph_key, graph_name, status, fused_info(entry.payload), seconds,
                       replaced)


def _unusable(cache: GraphCache, stored: Entry, source: str) -> str | None:
    """Why a stored fused entry would never be used here (another graph's,
    malformed, signed with another key, for another CPU), or None."""
    from ..graph.fused.library_entries import usable_library

    try:
        usable_library(stored, program_secret(cache.config.secret, cache.config.directory),
                       source)
    except EntryError as exc:
        return str(exc)
    return None
