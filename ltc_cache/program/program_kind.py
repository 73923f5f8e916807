"""The program entry kind as ``ltc-cache`` handles it (its registration,
passed to entries/kind_registry.py's ``register`` when this module is
imported: single_graph.py, frames/stored.py and ltc_cache.report import it).

A program entry holds what Dynamo captured of a function: the records of
the sources it inlined, its portable checks and a signed pickle
(:func:`~ltc_cache.program.program_entries.program_entry`). ``verify`` checks the
signature without unpickling anything; ``show`` gives the pickle's size,
never its bytes.

No torch at import: ``ls`` resolves this.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..entries.kind_registry import KindHandlers, KindView, ShowContext, register
from ..entries.kinds import EntryKind
from ..graph.graph_kind import no_fields
from ..units import format_size

if TYPE_CHECKING:
    from ..entries.entry import Entry

__all__ = ["PROGRAM"]


def _verify(entry: Entry, secret: bytes | None, directory: str | Path) -> None:
    from .program_entries import check_program

    check_program(entry, secret, Path(directory))


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


def _show(entry: Entry, context: ShowContext) -> KindView:
    payload = dict(entry.payload)
    artifact = payload.pop("artifact", b"")  # a pickle: its size here, never its bytes
    payload["artifact_size"] = len(artifact) if isinstance(artifact, bytes) else None
    payload.pop("hmac", None)
    frames = payload.get("frames")
    if isinstance(frames, dict):  # a function Dynamo compiles as several frames
        fields = _frames_fields(payload, frames)
    else:
        fields = [("Program", f"{len(payload.get('sources') or ())} inlined sources, "
                              f"{len(payload.get('checks') or ())} portable checks, "
                              f"{format_size(payload.get('artifact_size') or 0)} "
                              f"artifact (signed; the rest: --json)")]
    return KindView(payload, fields, ["", (
        "A program: what Dynamo captured of a function (ltc_cache.compile), signed, "
        "which a warm process\nloads instead of capturing; its graphs and plan are "
        "entries of their own.")])


PROGRAM = register(KindHandlers(EntryKind.PROGRAM, verify=_verify, show=_show,
                                summarise=no_fields))
