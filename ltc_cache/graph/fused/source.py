"""What a graph's fused library is compiled from, as one digest: the key a
library is stored under in place of the graph entry's own.

A graph entry's key holds what the graph was traced from, names included:
the parameters of layer 2 and of layer 3 are other tensors, so identical
layers are entries of their own. Their libraries are not: a library is
compiled from the TorchScript IR on inputs of the recorded layouts (its
inputs are the function's, parameters among them, passed at every call),
and the IR of identical layers is the same text. Keyed by that, a
12-layer model's per-layer regions are one compile, as a 4-layer model's
are, and every layer's entry finds the one library.

The digest covers the IR, each input's kind (an argument, a module tensor,
a constant; not which argument or which tensor), every input's layout
(dtype, sizes, strides), and the constants' values (a build runs on them).
It is read from the entry's stored form, so ``ltc-cache ls`` and ``fuse``
know it without torch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack

__all__ = ["SOURCE_VERSION", "library_source", "source_of_body"]

# Bumped when what the digest covers changes.
SOURCE_VERSION = 1


def library_source(ir: str, inputs: Sequence[Sequence[Any]], specs: Any) -> str | None:
    """The digest of what a library of the graph ``ir`` is compiled from:
    ``inputs`` in their stored form (``[kind, ref]``, a constant's ref its
    ``{"dtype", "shape", "data"}``), ``specs`` the recorded layouts. None
    where the graph has no IR or no layouts (no library is built for it)."""
    if not ir or not isinstance(specs, list) or len(specs) != len(inputs):
        return None
    kinds, constants = [], []
    for kind, ref in inputs:
        kinds.append(kind)
        if kind == "const":
            constants.append([ref["dtype"], ref["shape"], ref["data"]])
    packed = msgpack.packb([SOURCE_VERSION, ir, kinds, specs, constants], use_bin_type=True)
    return hashlib.sha256(packed).hexdigest()


def source_of_body(body: Mapping[str, Any]) -> str | None:
    """:func:`library_source` of a graph entry's stored body."""
    try:
        return library_source(body.get("ir") or "", body.get("inputs") or (),
                              (body.get("meta") or {}).get("input_specs"))
    except (KeyError, TypeError, ValueError):
        return None
