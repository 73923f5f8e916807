"""``where`` as masked fills, exact for every input (``a * c + b * (1 - c)``
turns -inf into NaN): what :mod:`ltc_cache.compile_backend.decompose`
decomposes ``aten.where.self`` into (docs/torch/ltc.md#some-ops-do-not-lower), and what
:mod:`ltc_cache.compile_backend.decompose_vision` builds with. The plan key
hashes this module's code too (:func:`ltc_cache.compile_backend.plan.plan_key`)."""

from __future__ import annotations

import torch

__all__ = ["masked_where"]

aten = torch.ops.aten


def masked_where(cond: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    dtype = torch.result_type(a, b)
    shape = torch.broadcast_shapes(cond.shape, a.shape, b.shape)
    cond = aten.expand.default(cond, shape)
    a = aten.expand.default(aten._to_copy.default(a, dtype=dtype), shape)
    b = aten.expand.default(aten._to_copy.default(b, dtype=dtype), shape)
    picked_a = aten.masked_fill.Scalar(a, aten.eq.Scalar(cond, 0), 0)
    picked_b = aten.masked_fill.Scalar(b, cond, 0)
    if dtype == torch.bool:
        return aten.bitwise_or.Tensor(picked_a, picked_b)
    return aten.add.Tensor(picked_a, picked_b)
