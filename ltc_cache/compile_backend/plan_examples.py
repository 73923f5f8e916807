"""The integer inputs of a plan's first real call, kept for its library's build.

A plan's library is compiled, checked and timed on example inputs made
from the layouts the plan recorded (:mod:`.plan_library`): random floating
values, which any graph takes. Integer and boolean inputs are indices,
positions, masks and counters, and a graph that indexes by them needs
their values: with zeros, a decoding step's key/value cache update finds
no valid position and the build fails. So the first call of a plan part
that has no library yet keeps its integer and boolean inputs' values,
read before the call (which may write them: a cache's position counter;
:data:`MAX_ELEMENTS` in all at most), as a small record beside the plan,
``ltc_cache:plan-example:<fused key>``, and whoever builds the library
uses them where the layout still matches.

A record, unsigned, rather than part of the plan: the plan is stored
during AOTAutograd's compile, on fake tensors, before any value exists;
and a value only feeds a build's check and timing, never code (a
library's code depends on its inputs' layouts alone, and its first real
call is compared with the per-region path whatever the build saw). A
missing or unreadable record means zeros, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..entries.wire import RECORD_PREFIX, read_record, write_record

if TYPE_CHECKING:
    from ..graph.cache import GraphCache

__all__ = ["EXAMPLE_PREFIX", "MAX_ELEMENTS", "Example", "example_values", "integer_inputs",
           "keep_example"]

logger = logging.getLogger("ltc_cache.fused")

EXAMPLE_PREFIX = RECORD_PREFIX + "plan-example:"
EXAMPLE_FORMAT = "ltc_cache.plan-example"
# Masks and positions of a batch of prompts; more is not an example.
MAX_ELEMENTS = 1 << 16


# The integer and boolean inputs of a call, by index, as their values' wire
# form; None where they are too many to keep.
Example = list[list[Any]] | None


def integer_inputs(args: Sequence[Any]) -> Example:
    """The values of the integer and boolean tensors among ``args``, read
    before the call (which may write them: a cache's position counter)."""
    chosen = [(i, t) for i, t in enumerate(args)
              if isinstance(t, torch.Tensor) and not (t.is_floating_point() or t.is_complex())]
    if sum(t.numel() for _, t in chosen) > MAX_ELEMENTS:
        return None
    return [[i, str(t.dtype).removeprefix("torch."), list(t.shape), t.flatten().tolist()]
            for i, t in chosen]


def keep_example(cache: GraphCache, fused_digest: str, inputs: Example) -> None:
    """Store ``inputs`` (:func:`integer_inputs` of a plan part's first real
    call) under ``fused_digest``. Never raises."""
    if not inputs or cache.store is None or cache.readonly:
        return
    try:
        cache.store.put(EXAMPLE_PREFIX + fused_digest,
                        write_record(EXAMPLE_FORMAT, {"inputs": inputs}))
    except Exception as exc:  # a hint: the build falls back to zeros
        logger.debug("cannot keep the example of %s: %s", fused_digest[:12], exc)


def example_values(cache: GraphCache, fused_digest: str) -> dict[int, torch.Tensor]:
    """The values :func:`keep_example` kept, by input index (empty where
    none is kept or the record does not hold)."""
    try:
        data = cache.store.get(EXAMPLE_PREFIX + fused_digest) if cache.store else None
    except Exception:
        return {}
    record = read_record(data, EXAMPLE_FORMAT) if data else None
    values: dict[int, torch.Tensor] = {}
    for item in (record or {}).get("inputs", []):
        try:
            index, dtype_name, shape, flat = item
            dtype = getattr(torch, dtype_name)
            if not isinstance(dtype, torch.dtype) or dtype.is_floating_point:
                continue
            values[int(index)] = torch.tensor(flat, dtype=dtype).reshape(shape)
        except (TypeError, ValueError, RuntimeError, AttributeError):
            continue
    return values
