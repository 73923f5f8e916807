"""The graph and negative entry kinds as ``ltc-cache`` handles them (their
registration, passed to entries/kind_registry.py's ``register`` when this
module is imported: graph/cache.py and ltc_cache.report import it).

A graph entry holds a replayable graph: its IR and the layout of its
inputs, outputs and in-place updates, which ``show`` lists. A negative
entry holds why a graph (or a program) could not be compiled. Neither has
more to verify than ``ltc-cache verify`` checks of every entry (the bytes,
the key, the IR), nor listing fields of its own.

No torch at import: ``ls`` resolves these.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..entries.kind_registry import KindHandlers, KindView, ShowContext, register
from ..entries.kinds import EntryKind

if TYPE_CHECKING:
    from ..entries.entry import Entry

__all__ = ["GRAPH", "NEGATIVE", "describe_source", "no_fields", "nothing_more"]


def describe_source(source: Any) -> str:
    """A graph input or output in a word: ``arg 0``, ``attr fc.weight``,
    ``const float64[] = 2.5``."""
    kind, ref = source
    if kind == "const" and hasattr(ref, "dtype"):
        dtype = str(ref.dtype).removeprefix("torch.")
        shape = ",".join(str(d) for d in ref.shape)
        value = f" = {ref.item():g}" if ref.numel() == 1 else ""
        return f"const {dtype}[{shape}]{value}"
    if kind == "none":
        return "none"
    return f"{kind} {ref}"


def nothing_more(entry: Entry, secret: bytes | None, directory: str | Path) -> None:
    """A kind's ``verify`` where the checks of every entry are all there is."""


def no_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """A kind's ``summarise`` where the listing fields of every entry are all there is."""
    return {}


def _show_graph(entry: Entry, context: ShowContext) -> KindView:
    inputs = [describe_source(s) for s in entry.inputs]
    outputs = [describe_source(s) for s in entry.outputs]
    updates = [f"output {u.output} -> {describe_source(u.target)}" for u in entry.updates]
    lines = ["", f"Inputs ({len(inputs)}), in graph parameter order:"]
    lines += [f"  %p{i:<4} {text}" for i, text in enumerate(inputs)]
    lines += ["", f"Outputs ({len(outputs)}):"]
    lines += [f"  {i:<5} {text}" for i, text in enumerate(outputs)]
    if updates:
        lines += ["", f"In-place updates ({len(updates)}):", *(f"  {u}" for u in updates)]
    if context.with_ir:
        lines += ["", "IR:", *(f"  {line}" for line in (entry.ir or "(empty)").splitlines())]
    return KindView(dict(entry.payload), [], lines)


def _show_negative(entry: Entry, context: ShowContext) -> KindView:
    payload = dict(entry.payload)
    return KindView(payload, [("Reason", str(payload.get("reason", "?")))], ["", (
        "A negative entry: this graph (or program) could not be compiled (Reason above), "
        "so no process\ntries again; the graph is partitioned or runs eagerly, the "
        "program runs through torch.compile.\nIt holds no inputs, outputs or IR.")])


def _summarise_graph(body: Mapping[str, Any]) -> dict[str, Any]:
    # What its fused library is keyed by, so that `ltc-cache fuse` knows
    # from the listing alone which graphs have one.
    from .fused.source import source_of_body

    return {"source": source_of_body(body)}


GRAPH = register(KindHandlers(EntryKind.GRAPH, verify=nothing_more, show=_show_graph,
                              summarise=_summarise_graph, fuses=True))
NEGATIVE = register(KindHandlers(EntryKind.NEGATIVE, verify=nothing_more, show=_show_negative,
                                 summarise=no_fields))
