"""The fused entry kind as ``ltc-cache`` handles it (its registration,
passed to entries/kind_registry.py's ``register`` when this module is
imported: graph/fused/tier.py and ltc_cache.report import it): what
``show`` and ``verify`` say of a fused entry
(:mod:`~ltc_cache.graph.fused.library_entries`), and how ``ls`` and
``stats`` tell its libraries from its refusals.

No torch at import: ``ls`` and ``stats`` resolve this. Nothing here loads
a library.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...entries.kind_registry import (
    KindHandlers,
    KindView,
    ShowContext,
    SummaryParts,
    register,
)
from ...entries.kinds import EntryKind
from ...entries.wire import is_entry_key
from ...errors import EntryError
from ...signing import key_path, read_key
from ...units import format_size
from .cpu_isa import isa_runs_here, missing_features

if TYPE_CHECKING:
    from ...entries.entry import Entry

__all__ = ["FUSED", "FUSED_PARTS", "LIBRARY", "OTHER_CPU", "REFUSAL", "FusedInfo", "check_fused",
           "fused_info", "signature_str"]

LIBRARY, OTHER_CPU, REFUSAL = "library", "other-CPU library", "refusal"


def _part_of(summary: Mapping[str, Any]) -> str:
    if summary.get("fused") != LIBRARY:
        return REFUSAL
    isa = summary.get("isa")
    return OTHER_CPU if isinstance(isa, str) and not isa_runs_here(isa) else LIBRARY


# What a fused entry holds, in the order ``stats`` shows them: its listing
# summary's "fused" field says library or refusal, and the library's "isa"
# whether this CPU runs it.
FUSED_PARTS = SummaryParts("fused", (LIBRARY, OTHER_CPU, REFUSAL), _part_of)


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
    lacks: tuple[str, ...] | None = None  # what this CPU lacks of what the library needs

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
    def runs_here(self) -> bool | None:
        """Whether this CPU has every feature the library needs."""
        return None if self.lacks is None else not self.lacks

    @property
    def isa_str(self) -> str:
        """``AVX2 (this CPU runs it)``, ``AVX512 AVX512_VNNI (this CPU lacks
        AVX512_VNNI: not used here)``."""
        if self.isa is None:
            return "-"
        needs = self.isa or "no vector features"
        if self.lacks is None:
            return needs
        if not self.lacks:
            return f"{needs} (this CPU runs it)"
        return f"{needs} (this CPU lacks {' '.join(self.lacks)}: not used here)"

    @property
    def compile_seconds_str(self) -> str:
        return "-" if self.compile_seconds is None else f"{self.compile_seconds:.1f} s"

    @property
    def library_size_str(self) -> str:
        return "-" if self.library_size is None else format_size(self.library_size)

    def as_dict(self) -> dict[str, Any]:
        return {
            "graph_key": self.graph_key, "refused": self.refused, "reason": self.reason,
            "library_size": self.library_size, "library_size_str": self.library_size_str,
            "library_sha256": self.library_sha256, "isa": self.isa,
            "compile_seconds": self.compile_seconds, "compiler": self.compiler,
            "script_ms": self.script_ms, "fused_ms": self.fused_ms, "ratio": self.ratio,
            "runs_here": self.runs_here, "lacks": self.lacks,
        }


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def fused_info(payload: Mapping[str, Any]) -> FusedInfo:
    """The FusedInfo of a fused entry's payload, read leniently (what is
    missing or of the wrong type is None): a display, not a check."""
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
        lacks=tuple(missing_features(isa)) if isa is not None else None,
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
    from .library_entries import library_of, stored_library

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


def _verify(entry: Entry, secret: bytes | None, directory: str | Path) -> None:
    check_fused(entry, secret)


def _summarise(body: Mapping[str, Any]) -> dict[str, Any]:
    # Kept in the summary so that `ls` and `stats` tell libraries from
    # refusals, and say what CPU a library needs, without reading megabytes
    # of libraries.
    payload = body.get("payload") or {}
    if "library" not in payload:
        return {FUSED_PARTS.field: REFUSAL}
    return {FUSED_PARTS.field: LIBRARY, "isa": _text(payload.get("isa"))}


def _show(entry: Entry, context: ShowContext) -> KindView:
    """The graph the entry belongs to, its library (machine code: its size
    and digest here, never its bytes) or why it has none, and how its
    compile went."""
    payload = dict(entry.payload)
    fused = fused_info(payload)
    signature = signature_str(entry, context.secret)
    payload.pop("library", None)
    payload.pop("hmac", None)
    payload["library_size"] = fused.library_size
    graph_name = context.name_of(fused.graph_key)  # a plan's; a graph's is its content
    if payload.get("of") == EntryKind.GRAPH:
        graph = (f"{fused.graph_key} (the content of {entry.graph_name}: every graph of the "
                 "same IR and input layouts uses this entry)")
    else:
        graph = f"{fused.graph_key} " + (f"({graph_name})" if graph_name is not None
                                         else "(not stored here)")
    fields = [("Graph", graph)]
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
    return KindView(payload, fields, ["", (
        "A fused entry: the graph above compiled ahead by AOTInductor into a shared "
        "library (signed),\nwhich a process of the same torch, compiler and CPU calls "
        "instead of its TorchScript function;\nor, refused, why the graph has none, so "
        "no process compiles it again (`ltc-cache fuse --retry` does).\nIt holds no "
        "inputs, outputs or IR.")], {"fused": fused.as_dict(), "signature": signature})


FUSED = register(KindHandlers(EntryKind.FUSED, verify=_verify, show=_show,
                              summarise=_summarise, parts=FUSED_PARTS))
