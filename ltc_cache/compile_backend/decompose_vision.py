"""Decompositions for the ops of vision models' training graphs that the
LTC TorchScript backend does not lower (docs/torch/ltc.md#cnn-backward-lowers-more-than-probed):
MobileNetV2's ReLU6 (``hardtanh`` and its backward), LeViT's and
MobileNetV3's ``hardswish`` and its backward, and advanced indexing
(LeViT's attention biases, bilinear upsampling's ``_unsafe_index``) with
the ``index_put`` that accumulates its gradient. Each of them left eagerly
split a CNN's graph into one LTC region per block. And BatchNorm in
training, as eager computes it (:func:`_batch_norm_training`); Swin's
``roll`` and the functional ``copy`` of its pooler's gradient, and
GhostNet's ``hardsigmoid_backward`` (docs/torch/ltc.md#roll-and-copy-do-not-lower and
docs/torch/ltc.md#hardsigmoid-backward-does-not-lower).

Kept apart from :mod:`ltc_cache.compile_backend.decompose` (which merges
this table into its own), so that each can change without the other; the
``where`` both build with is here (:func:`masked_where`). The plan key
hashes this module's code too
(:func:`ltc_cache.compile_backend.plan.plan_key`). Like those, each is exact
for every input it accepts, and returns ``NotImplemented`` (leaving the op
whole) for the inputs it does not handle.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..fx_ops import decompositions_of

__all__ = ["masked_where", "vision_decompositions"]

aten = torch.ops.aten


# ``where`` as masked fills, exact for every input (``a * c + b * (1 - c)``
# turns -inf into NaN): what :mod:`ltc_cache.compile_backend.decompose`
# decomposes ``aten.where.self`` into (docs/torch/ltc.md#some-ops-do-not-lower), and what
# the decompositions here build with. No docstring: the plan key hashes the
# function's code, its constants included, as it was in decompose_where.py.
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


def _hardtanh(x: torch.Tensor, min_val: float = -1.0, max_val: float = 1.0) -> torch.Tensor:
    # The CPU kernel is a clamp too: the same values, bit for bit.
    return aten.clamp.default(x, min_val, max_val)


def _hardtanh_backward(grad: torch.Tensor, x: torch.Tensor, min_val: float,
                       max_val: float) -> torch.Tensor:
    # The CPU kernel's vectorised loop (every tensor but a tail of a few
    # elements): the gradient where min < x < max, else 0 (NaN in x too).
    inside = aten.bitwise_and.Tensor(aten.gt.Scalar(x, min_val), aten.lt.Scalar(x, max_val))
    return aten.masked_fill.Scalar(grad, aten.eq.Scalar(inside, 0), 0)


def _hardswish(x: torch.Tensor) -> torch.Tensor:
    # The CPU kernel's own order: x * min(max(x + 3, 0), 6) / 6.
    return aten.div.Scalar(aten.mul.Tensor(x, aten.clamp.default(aten.add.Scalar(x, 3), 0, 6)), 6)


def _hardswish_backward(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    # The CPU kernel's vectorised loop: 0 up to -3, the gradient from 3 on,
    # grad * (x / 3 + 0.5) between them (and for NaN).
    middle = aten.mul.Tensor(grad, aten.add.Scalar(aten.div.Scalar(x, 3), 0.5))
    upper = masked_where(aten.ge.Scalar(x, 3), grad, middle)
    return aten.masked_fill.Scalar(upper, aten.le.Scalar(x, -3), 0)


def _hardsigmoid_backward(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    # The CPU kernel: grad / 6 as grad * (1 / 6) where -3 < x < 3, else 0
    # (NaN in x too). GhostNet's squeeze-excite gate.
    inside = aten.bitwise_and.Tensor(aten.gt.Scalar(x, -3), aten.lt.Scalar(x, 3))
    return aten.masked_fill.Scalar(aten.mul.Scalar(grad, 1.0 / 6.0), aten.eq.Scalar(inside, 0), 0)


def _roll(x: torch.Tensor, shifts: Sequence[int], dims: Sequence[int] = ()) -> torch.Tensor:
    # Swin's shifted windows and their gradient: each shift as the two
    # slices of the dimension, concatenated the other way round (the same
    # elements moved, no arithmetic).
    if not dims:  # over the flattened tensor
        return aten.view.default(_roll(aten.reshape.default(x, [-1]), shifts, [0]),
                                 list(x.shape))
    if len(shifts) != len(dims):
        return NotImplemented
    moved = False
    for shift, dim in zip(shifts, dims, strict=True):
        length = x.shape[dim]
        start = length - shift % length if length else 0
        if start in (0, length):
            continue
        x = aten.cat.default([aten.slice.Tensor(x, dim, start, length),
                              aten.slice.Tensor(x, dim, 0, start)], dim)
        moved = True
    return x if moved else aten.clone.default(x)  # a new tensor, as roll's


def _copy(x: torch.Tensor, source: torch.Tensor, non_blocking: bool = False) -> Any:
    # The functional copy (x's values replaced by source's, broadcast, in
    # x's dtype): what AOTAutograd writes for a gradient into a new
    # tensor's view (Swin's pooler backward). Eager's result has x's
    # strides, which an as_strided after it may read by: x contiguous only.
    if source.device != x.device or not x.is_contiguous():
        return NotImplemented
    values = aten._to_copy.default(source, dtype=x.dtype)
    return aten.clone.default(aten.expand.default(values, list(x.shape)))


def _linear_index(x: torch.Tensor, indices: Sequence[torch.Tensor | None]
                  ) -> tuple[int, int, torch.Tensor] | None:
    """For indices that are integer tensors on consecutive dimensions
    ``first .. first + count - 1`` (None elsewhere): ``(first, count, index)``
    where ``index`` is the broadcast position into those dimensions taken as
    one, negative positions wrapped. None for any other indexing (booleans,
    tensors apart, which move the indexed dimensions first)."""
    dims = [d for d, index in enumerate(indices) if index is not None]
    if not dims or dims != list(range(dims[0], dims[-1] + 1)) or len(indices) > x.dim():
        return None
    chosen = [indices[d] for d in dims]
    if any(index.dtype not in (torch.int64, torch.int32) for index in chosen):
        return None
    shape = torch.broadcast_shapes(*(index.shape for index in chosen))
    linear = None
    for d, index in zip(dims, chosen, strict=True):
        size = x.shape[d]
        index = aten.remainder.Scalar(aten._to_copy.default(index, dtype=torch.int64), size)
        index = aten.expand.default(index, shape)
        linear = index if linear is None else aten.add.Tensor(aten.mul.Scalar(linear, size), index)
    return dims[0], len(dims), linear


def _flat(x: torch.Tensor, first: int, count: int) -> torch.Tensor:
    """``x`` with its dimensions ``first .. first + count - 1`` as one."""
    size = math.prod(x.shape[first:first + count])
    return aten.reshape.default(x, [*x.shape[:first], size, *x.shape[first + count:]])


def _gather_index(x_flat: torch.Tensor, first: int, linear: torch.Tensor) -> torch.Tensor:
    """The flat positions expanded over ``x_flat``'s other dimensions, as
    ``gather`` and ``scatter_add`` take them."""
    count = linear.numel()
    view = [1] * first + [count] + [1] * (x_flat.dim() - first - 1)
    shape = [*x_flat.shape[:first], count, *x_flat.shape[first + 1:]]
    return aten.expand.default(aten.reshape.default(linear, view), shape)


def _index(x: torch.Tensor, indices: Sequence[torch.Tensor | None]) -> Any:
    found = _linear_index(x, indices)
    if found is None:
        return NotImplemented
    first, count, linear = found
    flat = _flat(x, first, count)
    picked = aten.gather.default(flat, first, _gather_index(flat, first, linear))
    return aten.reshape.default(picked, [*x.shape[:first], *linear.shape,
                                         *x.shape[first + count:]])


def _index_put(x: torch.Tensor, indices: Sequence[torch.Tensor | None],
               values: torch.Tensor, accumulate: bool = False) -> Any:
    # Only the accumulating form (an indexing's gradient): with repeated
    # positions, which write wins is the kernel's choice otherwise.
    found = _linear_index(x, indices) if accumulate else None
    if found is None:
        return NotImplemented
    first, count, linear = found
    flat = _flat(x, first, count)
    shape = [*x.shape[:first], *linear.shape, *x.shape[first + count:]]
    values = aten.expand.default(values, shape)
    values = aten.reshape.default(values, [*x.shape[:first], linear.numel(),
                                           *x.shape[first + count:]])
    index = _gather_index(flat, first, linear)
    out = aten.scatter_add.default(flat, first, index, aten._to_copy.default(values,
                                                                            dtype=x.dtype))
    return aten.reshape.default(out, list(x.shape))


def _batch_norm_training(torch_decomposition: Callable[..., Any]) -> Callable[..., Any]:
    """BatchNorm in training as eager computes it: ``native_batch_norm``
    itself (LTC lowers it, and its backward, when it is given no running
    statistics), and the update of the running statistics beside it as
    plain ops. torch's own decomposition (mean, variance, normalise as
    separate ops) put LeViT's gradients 4.2e-3 of the largest from eager's
    (docs/torch/ltc.md#cnn-backward-lowers-more-than-probed). Other dtypes and evaluation keep
    torch's."""
    def batch_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                   running_mean: torch.Tensor, running_var: torch.Tensor, training: bool,
                   momentum: float, eps: float) -> Any:
        if not training or x.dtype not in (torch.float32, torch.float64) \
                or running_mean.dtype != x.dtype or running_var.dtype != x.dtype:
            return torch_decomposition(x, weight, bias, running_mean, running_var, training,
                                       momentum, eps)
        out, mean, invstd = aten.native_batch_norm.default(x, weight, bias, None, None, True,
                                                           momentum, eps)
        dims = [d for d in range(x.dim()) if d != 1]
        count = math.prod(x.shape[d] for d in dims)
        shape = [1, -1] + [1] * (x.dim() - 2)
        squares = aten.pow.Tensor_Scalar(
            aten.sub.Tensor(x, aten.reshape.default(mean, shape)), 2)
        unbiased = aten.div.Scalar(aten.sum.dim_IntList(squares, dims), max(count - 1, 1))
        new_mean = aten.add.Tensor(aten.mul.Scalar(mean, momentum),
                                   aten.mul.Scalar(running_mean, 1 - momentum))
        new_var = aten.add.Tensor(aten.mul.Scalar(unbiased, momentum),
                                  aten.mul.Scalar(running_var, 1 - momentum))
        return out, mean, invstd, new_mean, new_var
    return batch_norm


def vision_decompositions() -> dict[Any, Callable[..., Any]]:
    """Ours for the vision ops LTC does not lower; merged into
    :func:`ltc_cache.compile_backend.decompose.decompositions`."""
    functional = aten._native_batch_norm_legit_functional.default
    return {
        functional: _batch_norm_training(decompositions_of([functional])[functional]),
        aten.hardtanh.default: _hardtanh,
        aten.hardtanh_backward.default: _hardtanh_backward,
        aten.hardswish.default: _hardswish,
        aten.hardswish_backward.default: _hardswish_backward,
        aten.hardsigmoid_backward.default: _hardsigmoid_backward,
        aten.roll.default: _roll,
        aten.copy.default: _copy,
        aten.index.Tensor: _index,
        aten._unsafe_index.Tensor: _index,
        aten.index_put.default: _index_put,
        aten._unsafe_index_put.default: _index_put,
    }
