"""The plan entry kind as ``ltc-cache`` handles it (its registration,
passed to entries/kind_registry.py's ``register`` when this module is
imported: plan_compile.py and ltc_cache.report import it).

A plan holds AOTAutograd's graphs split into LTC regions and an eager rest,
as data (:func:`~ltc_cache.compile_backend.plan.partitioned_to_wire`); a
training plan holds its backward and their joint layout too
(:mod:`~ltc_cache.compile_backend.joint`). ``verify`` rebuilds them;
``show`` counts their nodes from the wire form, leniently, without
rebuilding anything.

No torch at import: ``ls`` resolves this.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..entries.kind_registry import KindHandlers, KindView, ShowContext, register
from ..entries.kinds import EntryKind
from ..graph.graph_kind import no_fields

if TYPE_CHECKING:
    from ..entries.entry import Entry

__all__ = ["PLAN"]


def _verify(entry: Entry, secret: bytes | None, directory: str | Path) -> None:
    """Both graphs and their layout of a training plan, the graph of any
    other, rebuilt from the wire form (EntryError where they do not)."""
    from .joint import joint_graphs
    from .plan import plan_graph

    if "joint" in entry.payload:
        joint_graphs(entry)
    else:
        plan_graph(entry)


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


def _show(entry: Entry, context: ShowContext) -> KindView:
    payload = dict(entry.payload)
    fields = [(label, _partitioned_summary(payload[name]))
              for label, name in (("Plan", "plan"), ("Backward", "backward"))
              if isinstance(payload.get(name), dict)]
    joint = payload.get("joint")
    if isinstance(joint, dict):  # a training plan's layout
        fields.append(("Joint", f"{joint.get('outputs')} outputs, "
                                f"{joint.get('saved')} + {joint.get('saved_unchecked')} "
                                f"saved tensors, {len(joint.get('tangents') or ())} tangents"))
    return KindView(payload, fields, ["", (
        "A plan: AOTAutograd's graphs, split into LTC regions and an eager rest, as data "
        "(Plan above),\nwhich a warm process runs instead of running AOTAutograd and "
        "partitioning; its LTC regions'\ncompiled graphs are entries of their own. "
        "The graphs: --json.")])


PLAN = register(KindHandlers(EntryKind.PLAN, verify=_verify, show=_show, summarise=no_fields,
                             fuses=True))
