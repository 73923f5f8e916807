"""Where each graph input comes from and where each output goes.

A :class:`Source` names a value by kind:

- ``arg``: ``args[ref]`` of the call;
- ``attr``: the module tensor at dotted path ``ref``, bound live;
- ``const``: a tensor stored in the entry (``ref``), e.g. a scalar the
  trace captured;
- ``out``: output ``ref`` of the compiled graph;
- ``none`` / ``value``: a ``None`` or plain Python output ``ref``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["INPUT_KINDS", "OUTPUT_KINDS", "Source", "Update"]

INPUT_KINDS = frozenset({"arg", "attr", "const"})
OUTPUT_KINDS = frozenset({"arg", "attr", "const", "out", "none", "value"})


class Source(NamedTuple):
    kind: str
    ref: Any


class Update(NamedTuple):
    """An argument or module tensor the graph updates in place: after a call,
    graph output ``output`` is copied into ``target``."""

    output: int
    target: Source
