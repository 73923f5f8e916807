"""The decomposition table AOTAutograd traces with, for
``torch.compile(backend="ltc_cache")``: the ops the LTC TorchScript backend
cannot lower (docs/torch/ltc.md#some-ops-do-not-lower: ``where.self``, ``sin``, ``split``,
...) rewritten into ops it lowers.

Each one is exact for every input, not only for the inputs the models at
hand feed it (masked fills instead of ``a * c + b * (1 - c)``, which turns
-inf into NaN). A change here changes what a stored plan holds, so the
plan key hashes this module's code (:func:`ltc_cache.compile_backend.plan.plan_key`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from ..fx_ops import decompositions_of
from .decompose_vision import masked_where

__all__ = ["decompositions"]

aten = torch.ops.aten


def _logical_not(x: torch.Tensor) -> torch.Tensor:
    return aten.eq.Scalar(x, 0)


def _logical_and(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return aten.bitwise_and.Tensor(aten.ne.Scalar(a, 0), aten.ne.Scalar(b, 0))


def _logical_or(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return aten.bitwise_or.Tensor(aten.ne.Scalar(a, 0), aten.ne.Scalar(b, 0))


def _count_true(x: torch.Tensor, dims: list[int] | None, keepdim: bool) -> torch.Tensor:
    dims = list(range(x.dim())) if dims is None else dims
    return aten.sum.dim_IntList(aten.ne.Scalar(x, 0), dims, keepdim, dtype=torch.int64)


def _any_dim(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    return aten.ne.Scalar(_count_true(x, [dim], keepdim), 0)


def _any_dims(x: torch.Tensor, dim: list[int] | None = None,
              keepdim: bool = False) -> torch.Tensor:
    return aten.ne.Scalar(_count_true(x, dim, keepdim), 0)


def _any(x: torch.Tensor) -> torch.Tensor:
    return aten.ne.Scalar(_count_true(x, None, False), 0)


def _all_dim(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    return aten.eq.Scalar(_count_true(aten.eq.Scalar(x, 0), [dim], keepdim), 0)


def _all_dims(x: torch.Tensor, dim: list[int] | None = None,
              keepdim: bool = False) -> torch.Tensor:
    return aten.eq.Scalar(_count_true(aten.eq.Scalar(x, 0), dim, keepdim), 0)


def _split_with_sizes(x: torch.Tensor, sizes: list[int], dim: int = 0) -> list[torch.Tensor]:
    out, start = [], 0
    for size in sizes:
        out.append(aten.slice.Tensor(x, dim, start, start + size))
        start += size
    return out


def _split(x: torch.Tensor, size: int, dim: int = 0) -> list[torch.Tensor]:
    length = x.shape[dim]
    sizes = [min(size, length - start) for start in range(0, length, size)] or [0]
    return _split_with_sizes(x, sizes, dim)


def _unbind(x: torch.Tensor, dim: int = 0) -> list[torch.Tensor]:
    return [aten.select.int(x, dim, i) for i in range(x.shape[dim])]


def _sin(x: torch.Tensor) -> torch.Tensor:
    # cos lowers, sin does not; the shift costs one rounding of x (rotary
    # embeddings: |x| < max positions, so well under 1e-5 absolute).
    return aten.cos.default(aten.sub.Tensor(x, math.pi / 2))


def _isneginf(x: torch.Tensor) -> torch.Tensor:
    return aten.eq.Scalar(x, -math.inf)


def _reduced_dims(x: torch.Tensor, dim: int | list[int] | None) -> list[int]:
    if dim is None:
        return list(range(x.dim()))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return [d % max(x.dim(), 1) for d in dims] if dims else list(range(x.dim()))


def _var_mean(x: torch.Tensor, dim: int | list[int] | None = None, *,
              correction: float | None = None, keepdim: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor]:
    # Two passes (mean, then squared deviations): what eager computes, to
    # rounding, and no prims ops that LTC cannot take.
    dims = _reduced_dims(x, dim)
    count = math.prod(x.shape[d] for d in dims)
    mean = aten.mean.dim(x, dims, True)
    squares = aten.pow.Tensor_Scalar(aten.sub.Tensor(x, mean), 2)
    divisor = max(count - (1 if correction is None else correction), 0)
    var = aten.div.Scalar(aten.sum.dim_IntList(squares, dims, keepdim), divisor)
    return var, (mean if keepdim else aten.squeeze.dims(mean, dims))


def _var(x: torch.Tensor, dim: int | list[int] | None = None, *,
         correction: float | None = None, keepdim: bool = False) -> torch.Tensor:
    return _var_mean(x, dim, correction=correction, keepdim=keepdim)[0]


def _transformer_encoder_layer(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                               proj_bias, use_gelu, norm_first, eps, norm_weight_1, norm_bias_1,
                               norm_weight_2, norm_bias_2, ffn_weight_1, ffn_bias_1,
                               ffn_weight_2, ffn_bias_2, mask=None, mask_type=None):
    """nn.TransformerEncoderLayer's inference fast path (batch first), as the
    ops it is made of. Masks keep the fused op."""
    if mask is not None or src.dim() != 3 or src.is_nested:
        return NotImplemented
    F = torch.nn.functional
    batch, length, _ = src.shape
    head_dim = embed_dim // num_heads

    def norm(x, weight, bias):
        return F.layer_norm(x, (embed_dim,), weight, bias, eps)

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    qkv = F.linear(x, qkv_weight, qkv_bias).view(batch, length, 3, num_heads, head_dim)
    qkv = qkv.permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    scores = torch.matmul(q * (1.0 / math.sqrt(head_dim)), k.transpose(-2, -1))
    attn = torch.matmul(torch.softmax(scores, dim=-1), v)
    attn = attn.transpose(1, 2).reshape(batch, length, embed_dim)
    x = F.linear(attn, proj_weight, proj_bias) + src
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    residual = x
    if norm_first:
        x = norm(x, norm_weight_2, norm_bias_2)
    x = F.linear(x, ffn_weight_1, ffn_bias_1)
    x = F.gelu(x) if use_gelu else F.relu(x)
    x = F.linear(x, ffn_weight_2, ffn_bias_2) + residual
    return x if norm_first else norm(x, norm_weight_2, norm_bias_2)


def decompositions() -> dict[Any, Callable[..., Any]]:
    """The table AOTAutograd traces with: ours for the ops LTC cannot lower,
    and torch's own where its parts lower. Ops LTC lowers natively
    (``native_layer_norm``, ``gelu``, ``_softmax`` …) are left whole: fewer
    nodes make every later cost smaller (docs/torch/ltc.md#warm-start-floor-grows-with-nodes).

    CPU flash attention (``_scaled_dot_product_flash_attention_for_cpu`` and
    its backward) is not decomposed: it stays one fused op that runs eagerly
    between two regions. As matmuls and a softmax over the whole score
    matrix it cost Llama 1.39x eager and GPT-2 1.18x at hidden 256, sequence
    128 (1.00x and 1.03x fused), and it was no faster at the tests' tiny
    sizes; the fused kernel skips the masked half of causal attention
    (``tools/bench/steady.py``, BENCHMARKS.md). Not causal either: a ViT
    training step at 197 tokens was 11-24% slower decomposed
    (docs/torch/ltc.md#flash-attention-stays-eager)."""
    table = decompositions_of([
        aten._native_batch_norm_legit_functional.default,
        aten._native_batch_norm_legit_no_training.default,
        aten._native_batch_norm_legit.default,
        aten._native_batch_norm_legit.no_stats,
        aten._safe_softmax.default,
    ])
    table.update({
        aten.where.self: masked_where,
        aten.logical_not.default: _logical_not,
        aten.logical_and.default: _logical_and,
        aten.logical_or.default: _logical_or,
        aten.any.dim: _any_dim,
        aten.any.dims: _any_dims,
        aten.any.default: _any,
        aten.all.dim: _all_dim,
        aten.all.dims: _all_dims,
        aten.split_with_sizes.default: _split_with_sizes,
        aten.split.Tensor: _split,
        aten.unbind.int: _unbind,
        aten.sin.default: _sin,
        aten.isneginf.default: _isneginf,
        aten.var_mean.correction: _var_mean,
        aten.var.correction: _var,
        aten._transformer_encoder_layer_fwd.default: _transformer_encoder_layer,
    })
    from .decompose_vision import vision_decompositions

    table.update(vision_decompositions())
    return table

