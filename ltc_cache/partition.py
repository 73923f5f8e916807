"""Split an aten graph into the regions LTC lowers and an eager rest.

The LTC TorchScript backend lowers most aten ops but not all of them (fact 10
in docs/design.md: ``where.self``, ``sin``, ``split``, CPU flash attention, …). A
graph holding one of those is refused whole by the original extraction. Here
each op is probed once on lazy zeros shaped like its inputs; what lowers is
fused into regions by FX's capability-based partitioner, and the rest stays
in the parent graph, run eagerly between the regions.

What the probe learns is kept in the store under a key that is not an entry
digest (``ltc_cache:op-support:<torch version>``), so a warm process never
probes an op again.
"""

from __future__ import annotations

import logging
import math
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions
from torch.utils._python_dispatch import _disable_current_modes

from .store import Store
from .wire import read_record, write_record

__all__ = [
    "SUPPORT_RECORD_FORMAT",
    "OpSupport",
    "Partitioned",
    "aten_op_count",
    "decompositions",
    "op_signature",
    "partition",
    "support_record_key",
]

logger = logging.getLogger("ltc_cache.partition")

aten = torch.ops.aten
SUPPORT_RECORD_FORMAT = "ltc_cache.op-support"
_SUPPORT_RECORD_VERSION = 1


def support_record_key() -> str:
    """Store key of the learned op support of this torch build. It is not 64
    hex digits, so listing and pruning can tell it from an entry."""
    return f"ltc_cache:op-support:{torch.__version__}:{torch.version.git_version}"


# --- decompositions into ops the TorchScript backend lowers ------------------
#
# Each one is exact for every input, not only for the inputs the models at hand
# feed it (masked fills instead of ``a * c + b * (1 - c)``, which turns -inf
# into NaN).


def _where(cond: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
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
    nodes make every later cost smaller (fact 13 in docs/design.md).

    CPU flash attention (``_scaled_dot_product_flash_attention_for_cpu`` and
    its backward) is not decomposed: it stays one fused op that runs eagerly
    between two regions. As matmuls and a softmax over the whole score
    matrix it cost Llama 1.39x eager and GPT-2 1.18x at hidden 256, sequence
    128 (1.00x and 1.03x fused), and it was no faster at the tests' tiny
    sizes; the fused kernel skips the masked half of causal attention
    (``tools/bench_steady.py``, BENCHMARKS.md)."""
    from torch._decomp import get_decompositions

    table = get_decompositions([
        aten._native_batch_norm_legit_functional.default,
        aten._native_batch_norm_legit_no_training.default,
        aten._native_batch_norm_legit.default,
        aten._native_batch_norm_legit.no_stats,
        aten._safe_softmax.default,
    ])
    table.update({
        aten.where.self: _where,
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
    return table


# --- learning what lowers ----------------------------------------------------


def _val(node: Any) -> Any:
    return node.meta.get("val", node.meta.get("example_value")) if isinstance(node, fx.Node) \
        else node


def op_signature(node: fx.Node) -> str | None:
    """``aten.add.Tensor(float32,float32)``: the op and its tensor arguments'
    dtypes; None for nodes that are not aten ops."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    dtypes = []
    for arg in torch.utils._pytree.tree_leaves((node.args, node.kwargs)):
        value = _val(arg)
        if isinstance(value, torch.Tensor):
            dtypes.append(str(value.dtype).removeprefix("torch."))
    return f"{node.target}({','.join(dtypes)})"


def _static_rules(node: fx.Node) -> str | None:
    """Why a node can never go into a region, whatever the backend lowers."""
    target = node.target
    if torch.Tag.nondeterministic_seeded in target.tags:
        # LTC captures the seed as data: a stored graph would draw the same
        # numbers on every call.
        return "random"
    if target._schema.is_mutable:
        return "mutates an input"
    leaves = torch.utils._pytree.tree_leaves(_val(node))
    if not leaves or not all(isinstance(v, torch.Tensor) for v in leaves):
        return "returns a non-tensor"
    if any(isinstance(d, torch.SymInt) for v in leaves for d in v.shape):
        return "symbolic shape"
    for arg in torch.utils._pytree.tree_leaves((node.args, node.kwargs)):
        value = _val(arg)
        if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
            return "symbolic argument"
        if isinstance(value, torch.Tensor) and any(isinstance(d, torch.SymInt)
                                                   for d in value.shape):
            return "symbolic shape"
    return None


def _lazy_zeros(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.zeros(tuple(value.shape), dtype=value.dtype, device="lazy")
    return value


def _probe(node: fx.Node) -> str | None:
    """Run the node's op once on lazy zeros; None if LTC lowered it, else why not."""
    import torch._lazy
    import torch._lazy.metrics as metrics
    from torch._lazy.extract_compiled_graph import get_fallback_ops

    from .extract import _init_lazy_backend

    _init_lazy_backend()  # once per process: a second init raises

    def lazy_arg(arg: Any) -> Any:
        return _lazy_zeros(_val(arg))

    args = torch.utils._pytree.tree_map(lazy_arg, node.args)
    kwargs = dict(torch.utils._pytree.tree_map(lazy_arg, node.kwargs))
    if "device" in kwargs:
        kwargs["device"] = torch.device("lazy")
    metrics.reset()
    try:
        result = node.target(*args, **kwargs)
        tensors = [t for t in torch.utils._pytree.tree_leaves(result)
                   if isinstance(t, torch.Tensor)]
        torch._lazy.sync_multi(tensors, [])
        fallbacks = get_fallback_ops()
    except Exception as exc:  # LTC asserts come as several exception types
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        return f"{type(exc).__name__}: {lines[0][:200] if lines else ''}"
    finally:
        metrics.reset()
    return f"falls back ({', '.join(fallbacks)})" if fallbacks else None


class OpSupport(OperatorSupportBase):
    """Which aten ops (by signature) the TorchScript backend lowers: learned by
    probing, remembered in ``store`` per torch build.

    A record that cannot be read (corrupt, another format) is ignored: the ops
    are probed again and the record rewritten.
    """

    def __init__(self, store: Store | None = None, *, readonly: bool = False) -> None:
        super().__init__()
        self._store = store
        self._readonly = readonly
        self._known: dict[str, str] = {}  # signature -> "" (lowers) or why not
        self._loaded = False
        self.probes = 0  # ops probed by this object, for tests and logs

    # The record -------------------------------------------------------------

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        if self._store is None:
            return
        try:
            data = self._store.get(support_record_key())
        except Exception as exc:
            logger.warning("cannot read the op-support record (%s); probing again", exc)
            return
        if data is None:
            return
        known = _decode_record(data)
        if known is None:
            logger.warning("op-support record %s is unreadable; probing again",
                           support_record_key())
            return
        self._known.update(known)

    def _save(self) -> None:
        if self._store is None or self._readonly:
            return
        try:
            self._store.put(support_record_key(), _encode_record(self._known))
        except Exception as exc:
            logger.warning("cannot write the op-support record (%s)", exc)

    # Asking -----------------------------------------------------------------

    def learn(self, nodes: Iterable[fx.Node]) -> None:
        """Probe every op signature among ``nodes`` not known yet, and store
        what was learned."""
        self._load()
        todo: dict[str, fx.Node] = {}
        for node in nodes:
            signature = op_signature(node)
            if signature is None or signature in self._known or signature in todo:
                continue
            if _static_rules(node) is None:
                todo[signature] = node
        if not todo:
            return
        # Called from AOTAutograd's compilers with its FakeTensorMode active:
        # lazy tensors must be made outside it (fact 7 in docs/design.md).
        with _disable_current_modes():
            for signature, node in todo.items():
                why = _probe(node)
                self.probes += 1
                self._known[signature] = why or ""
                if why:
                    logger.info("LTC does not lower %s: %s", signature, why)
        self._save()

    def why_not(self, node: fx.Node) -> str | None:
        """None if ``node`` can go into an LTC region, else the reason."""
        if node.op != "call_function":
            return "not a call"
        if node.target is operator.getitem:
            source = node.args[0]
            if isinstance(source, fx.Node) and source.op == "call_function":
                return self.why_not(source)
            return "getitem of a non-op"
        signature = op_signature(node)
        if signature is None:
            return f"not an aten op ({node.target})"
        rule = _static_rules(node)
        if rule is not None:
            return rule
        self._load()
        why = self._known.get(signature)
        if why is None:
            return "not probed"
        return why or None

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module],
                          node: fx.Node) -> bool:
        return self.why_not(node) is None

    @property
    def unsupported(self) -> dict[str, str]:
        self._load()
        return {sig: why for sig, why in self._known.items() if why}


def _encode_record(known: Mapping[str, str]) -> bytes:
    return write_record(SUPPORT_RECORD_FORMAT, {
        "version": _SUPPORT_RECORD_VERSION,
        "torch": torch.__version__,
        "ops": dict(known),
    })


def _decode_record(data: bytes) -> dict[str, str] | None:
    obj = read_record(data, SUPPORT_RECORD_FORMAT)
    if obj is None or obj.get("version") != _SUPPORT_RECORD_VERSION \
            or obj.get("torch") != torch.__version__:
        return None
    ops = obj.get("ops")
    if not isinstance(ops, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                            for k, v in ops.items()):
        return None
    return ops


# --- partitioning ------------------------------------------------------------


def aten_op_count(nodes: Iterable[fx.Node]) -> int:
    return sum(1 for n in nodes if op_signature(n) is not None)


@dataclass(frozen=True)
class Partitioned:
    """``module`` calls each region as ``module.<region name>(*inputs)``; a
    region returns a tuple."""

    module: fx.GraphModule
    regions: tuple[str, ...]  # submodule names, in graph order
    region_ops: Mapping[str, int]  # aten ops in each region
    total_ops: int  # aten ops in the whole graph
    eager_ops: Mapping[str, int]  # op -> count of those left outside regions


# Fewer elements than this, and a copy at a region's output costs less than
# the view taken eagerly from Python in the parent graph: on the tests' tiny
# BERT (views of 512 elements) leaving them out made a call 13-21% slower.
_MIN_VIEW_ELEMENTS = 1 << 14


def _large_view(node: fx.Node) -> bool:
    value = _val(node)
    return op_signature(node) is not None and node.target.is_view \
        and isinstance(value, torch.Tensor) and value.numel() >= _MIN_VIEW_ELEMENTS


def _leave_out_trailing_views(nodes: dict[fx.Node, Any]) -> None:
    """Drop from a proposed region the view ops that only nodes outside it
    read, then the views only those read, and so on, in place.

    LTC lowers views to copies (fact 5 in docs/design.md), and a region's
    outputs keep their copies: a region that ended in the transposes that
    make attention's query, key and value heads returned each as a
    contiguous copy, for the fused attention op between regions to read.
    Left out, the region returns the tensor the views look at and the
    parent graph takes the views eagerly, which copies nothing. Only views
    go, so a region keeps the ops that made it worth a region, and only
    views of ``_MIN_VIEW_ELEMENTS`` or more, whose copy costs more than a
    view taken from Python. Views the graph returns stay: a training
    step's weight gradients come out of the backward through ``t``, and as
    views they made GPT-2's and BERT's steps 4-6% slower.
    """
    changed = True
    while changed:
        changed = False
        for node in list(nodes):
            if _large_view(node) and node.users \
                    and not any(u in nodes or u.op == "output" for u in node.users):
                del nodes[node]
                changed = True


def partition(gm: fx.GraphModule, support: OpSupport, *, prefix: str = "ltc_region_"
              ) -> Partitioned:
    """Fuse the LTC-lowerable parts of ``gm`` into submodules, in place.

    Ops that were never probed are probed first.
    """
    support.learn(gm.graph.nodes)
    partitioner = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True)
    # A region must compute something to pay for its lookup and replay call:
    # one of views alone would only copy (LTC lowers views to copies).
    proposed = [p for p in partitioner.propose_partitions()
                if any(op_signature(n) is not None and not n.target.is_view for n in p.nodes)]
    for part in proposed:
        _leave_out_trailing_views(part.nodes)
    # Graph order, so that region names are the same in every process.
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    proposed.sort(key=lambda p: min(order[n] for n in p.nodes))
    region_ops = {f"{prefix}{i}": aten_op_count(p.nodes) for i, p in enumerate(proposed)}
    inside = {node for p in proposed for node in p.nodes}
    total = 0
    eager: dict[str, int] = {}
    for node in gm.graph.nodes:
        if op_signature(node) is None:
            continue
        total += 1
        if node not in inside:
            eager[str(node.target)] = eager.get(str(node.target), 0) + 1
    if proposed:
        fuse_by_partitions(gm, [dict.fromkeys(p.nodes) for p in proposed], prefix=prefix,
                           always_return_tuple=True)
    outside = total - sum(region_ops.values())
    logger.debug("%d of %d aten ops in %d regions, %d outside", total - outside, total,
                 len(region_ops), outside)
    return Partitioned(gm, tuple(region_ops), region_ops, total, eager)
