"""The fused tier as ``ltc-cache`` sees it: ``fuse`` (compile the fused
libraries of stored graphs ahead), and what ``show`` and ``verify`` say of
a fused entry (ltc_cache/graph/fused/entries.py).

torch is imported inside the calls that compile, key or decode, never at
import: ``ls`` and ``stats`` import this package.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import EntryError
from ..kinds import EntryKind
from ..signing import key_path, program_secret, read_key
from ..store.disk import DiskStore
from ..units import format_size
from ..wire import is_entry_key
from .listing import EntryInfo, shown

if TYPE_CHECKING:
    from ..graph.cache import GraphCache
    from ..graph.entry import Entry

__all__ = ["FuseOutcome", "FuseTarget", "FusedInfo", "check_fused", "fuse_one", "fused_info",
           "plan_fuse", "signature_str"]

# What fuse_one did with a graph (FuseOutcome.status).
LIBRARY, REFUSED = "library", "refused"
ALREADY_FUSED, ALREADY_REFUSED = "already fused", "already refused"
GONE, NOT_STORED = "gone", "not stored"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


@dataclass(frozen=True)
class FusedInfo:
    """What a fused entry holds: a library (its size, digest, ISA) or the
    reason it has none, and the numbers of its compile, for ``show`` and
    the lines of ``fuse``. Timings are None where the compile never got
    as far as timing both tiers."""

    graph_key: str
    library_size: int | None  # None: a refusal
    library_sha256: str | None
    isa: str | None
    reason: str | None
    compile_seconds: float | None
    compiler: str | None
    script_ms: float | None  # TorchScript's milliseconds a call
    fused_ms: float | None  # the library's
    runs_here: bool | None = None  # whether this CPU has the library's ISA

    @property
    def refused(self) -> bool:
        return self.library_size is None

    @property
    def ratio(self) -> float | None:
        """The library's time a call as a fraction of TorchScript's."""
        if self.script_ms and self.fused_ms is not None:
            return self.fused_ms / self.script_ms
        return None

    @property
    def timing_str(self) -> str:
        """``0.45x of TorchScript's time (0.101 ms vs 0.224 ms)``, or ``-``."""
        if self.ratio is None:
            return "-"
        return (f"{self.ratio:.2f}x of TorchScript's time ({self.fused_ms:.3f} ms vs "
                f"{self.script_ms:.3f} ms)")

    @property
    def isa_str(self) -> str:
        """``AVX2 (this CPU runs it)``."""
        if self.isa is None:
            return "-"
        if self.runs_here is None:
            return self.isa or "any"
        return f"{self.isa or 'any'} " + ("(this CPU runs it)" if self.runs_here
                                          else "(this CPU lacks it: not used here)")

    compile_seconds_str = shown("compile_seconds", _seconds)
    library_size_str = shown("library_size", format_size, none="-")

    def as_dict(self) -> dict[str, Any]:
        return {
            "graph_key": self.graph_key, "refused": self.refused, "reason": self.reason,
            "library_size": self.library_size, "library_size_str": self.library_size_str,
            "library_sha256": self.library_sha256, "isa": self.isa,
            "compile_seconds": self.compile_seconds, "compiler": self.compiler,
            "script_ms": self.script_ms, "fused_ms": self.fused_ms, "ratio": self.ratio,
            "runs_here": self.runs_here,
        }


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def fused_info(payload: Mapping[str, Any]) -> FusedInfo:
    """The FusedInfo of a fused entry's payload, read leniently (what is
    missing or of the wrong type is None): a display, not a check."""
    from ..graph.fused.platform import isa_runs_here

    library, isa = payload.get("library"), _text(payload.get("isa"))
    return FusedInfo(
        graph_key=str(payload.get("graph_key", "?")),
        library_size=len(library) if isinstance(library, bytes) else None,
        library_sha256=_text(payload.get("library_sha256")),
        isa=isa,
        reason=_text(payload.get("reason")),
        compile_seconds=_number(payload.get("compile_seconds")),
        compiler=_text(payload.get("compiler")),
        script_ms=_number(payload.get("script_ms")),
        fused_ms=_number(payload.get("fused_ms")),
        runs_here=isa_runs_here(isa) if isa is not None else None,
    )


def _signing_key(shared: bytes | None) -> bytes | None:
    """The key fused libraries are signed with here, never created (as
    ``check_program`` reads it): None where this user has none."""
    try:
        return shared or read_key(key_path())
    except OSError:
        return None


def check_fused(entry: Entry, shared: bytes | None) -> bool:
    """Raise EntryError unless ``entry`` is a well-formed fused entry whose
    library's signature holds under this user's key (``shared``:
    LTC_CACHE_SECRET, else the per-user key). Returns whether the signature
    was checked: False where there is no key to check it with (a
    well-formed entry then passes, as a program does). Never creates the
    key, never loads the library."""
    from ..graph.fused.entries import library_of, stored_library

    graph_key = entry.payload.get("graph_key")
    if not is_entry_key(graph_key):
        raise EntryError("fused entry: malformed (no graph key)", entry.key)
    if stored_library(entry, graph_key) is None:
        return True  # a refusal is data: nothing in it is signed, nothing runs
    secret = _signing_key(shared)
    if secret is None:
        return False
    library_of(entry, secret, graph_key)
    return True


def signature_str(entry: Entry, shared: bytes | None) -> str:
    """What ``check_fused`` finds, in words, for ``show``."""
    try:
        checked = check_fused(entry, shared)
    except EntryError as exc:
        return f"BAD: {exc} (`ltc-cache verify --fix` removes it)"
    if "library" not in entry.payload:
        return "- (a refusal holds no code)"
    if not checked:
        return (f"not checked: no signing key here (LTC_CACHE_SECRET, or {key_path()}); "
                "a process loads the library only once it holds")
    return "holds under this user's key" + (" (LTC_CACHE_SECRET)" if shared else "")


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
    """The graph and plan entries among ``selected``, each with the fused entry
    ``every`` (the whole listing) holds under its fused key on this
    machine; from the listing alone, nothing decoded."""
    from ..graph.fused.platform import fused_key

    fused = {e.key: e.fused or "library" for e in every if e.kind == EntryKind.FUSED}
    targets = []
    for graph in selected:
        # A plan: its whole graphs.
        if graph.kind not in (EntryKind.GRAPH, EntryKind.PLAN) or graph.problem:
            continue
        key = fused_key(graph.key).digest
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
    from ..graph.fused.platform import fused_key

    store = cache.store
    if not isinstance(store, DiskStore):
        raise TypeError("fuse_one needs a GraphCache over a cache directory")
    started = time.monotonic()
    key = fused_key(graph_key)
    stored = cache.lookup_entry(key, count=False)
    replaced = None
    if stored is not None:
        replaced = _unusable(cache, stored, graph_key)
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


def _unusable(cache: GraphCache, stored: Entry, graph_key: str) -> str | None:
    """Why a stored fused entry would never be used here (another graph's,
    malformed, signed with another key, for another CPU), or None."""
    from ..graph.fused.entries import usable_library

    try:
        usable_library(stored, program_secret(cache.config.secret, cache.config.directory),
                       graph_key)
    except EntryError as exc:
        return str(exc)
    return None
