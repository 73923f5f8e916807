"""Which aten ops the LTC TorchScript backend lowers, learned by probing.

The backend lowers most aten ops but not all of them (docs/torch/ltc.md#some-ops-do-not-lower). Each
op signature (the op and its tensor arguments' dtypes) is probed once on lazy zeros shaped like its
inputs; what is learned is kept in the store as an internal record
(``ltc_cache:op-support:<torch version>``), so a warm process never probes
an op again.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import fx
from torch.fx.passes.operator_support import OperatorSupportBase

from ..entries.wire import SUPPORT_RECORD_FORMAT, read_record, write_record
from ..errors import first_line
from ..fx_ops import OpOverload, python_dispatcher_disabled, tree_leaves, tree_map
from ..store import Store
from ..threads import trace_lock
from .aot_autograd import real_tensors
from .nodes import is_symbolic, node_value

__all__ = ["OpSupport", "encode_support_record", "op_signature", "support_record_key"]

logger = logging.getLogger("ltc_cache.support")

# 2: records of 1 may hold native_batch_norm as unlowered (probed under the
# Python dispatcher).
_SUPPORT_RECORD_VERSION = 2


def support_record_key() -> str:
    """Store key of the learned op support of this torch build. It is not 64
    hex digits, so listing and pruning can tell it from an entry."""
    return f"ltc_cache:op-support:{torch.__version__}:{torch.version.git_version}"


def op_signature(node: fx.Node) -> str | None:
    """``aten.add.Tensor(float32,float32)``: the op and its tensor arguments'
    dtypes; None for nodes that are not aten ops."""
    if node.op != "call_function" or not isinstance(node.target, OpOverload):
        return None
    dtypes = []
    for arg in tree_leaves((node.args, node.kwargs)):
        value = node_value(arg)
        if isinstance(value, torch.Tensor):
            dtypes.append(str(value.dtype).removeprefix("torch."))
    return f"{node.target}({','.join(dtypes)})"


def static_rules(node: fx.Node) -> str | None:
    """Why a node can never go into a region, whatever the backend lowers."""
    target = node.target
    if torch.Tag.nondeterministic_seeded in target.tags:
        # LTC captures the seed as data: a stored graph would draw the same
        # numbers on every call.
        return "random"
    if target._schema.is_mutable:
        return "mutates an input"
    if strided_otherwise(node):
        return "as_strided over a layout that is not its input's contiguous order"
    # A None among the results is an output the graph asked not to have
    # (``convolution_backward``'s output_mask): no node reads it, and the
    # region returns only the tensors (docs/torch/ltc.md#cnn-backward-lowers-more-than-probed).
    leaves = [v for v in tree_leaves(node_value(node)) if v is not None]
    if not leaves or not all(isinstance(v, torch.Tensor) for v in leaves):
        return "returns a non-tensor"
    if any(is_symbolic(v) for v in leaves):
        return "symbolic shape"
    for arg in tree_leaves((node.args, node.kwargs)):
        if is_symbolic(node_value(arg)):
            return "symbolic argument"
    return None


# Ops that address their input's storage by strides.
_STRIDED = frozenset({torch.ops.aten.as_strided.default, torch.ops.aten.as_strided_copy.default,
                      torch.ops.aten.as_strided_scatter.default})


def strided_otherwise(node: fx.Node) -> bool:
    """Whether ``node`` is an ``as_strided`` that LTC would compute otherwise
    than eager (it then runs eagerly, over its input as eager lays it out)."""
    return node.target in _STRIDED and not strides_its_own_order(node)


def strides_its_own_order(node: fx.Node) -> bool:
    """Whether an ``as_strided`` reads the same elements in LTC as in eager.
    Eager's strides address the input's storage; LTC's address the input's
    elements in logical order. They agree where the input is contiguous
    from the offset used and the strides reach no element past its end.
    Longformer's sliding-window chunks take ``as_strided`` of a transposed
    view: in LTC that read other elements (docs/torch/ltc.md#ltc-as-strided-strides-elements)."""
    first = 2 if node.target is torch.ops.aten.as_strided_scatter.default else 1
    size, stride = node.args[first], node.args[first + 1]
    offset = node.args[first + 2] if len(node.args) > first + 2 \
        else node.kwargs.get("storage_offset")
    base = node_value(node.args[0])
    if not isinstance(base, torch.Tensor) or not base.is_contiguous():
        return False
    if offset is not None and offset != base.storage_offset():
        return False
    if any(n == 0 for n in size):  # reads nothing
        return True
    return sum((n - 1) * st for n, st in zip(size, stride, strict=True)) < base.numel()


def _lazy_zeros(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.zeros(tuple(value.shape), dtype=value.dtype, device="lazy")
    return value


def _probe(node: fx.Node) -> str | None:
    """Run the node's op once on lazy zeros; None if LTC lowered it, else why not."""
    from ..graph import lazy_bindings as ltc
    from ..graph.extract import init_lazy_backend

    init_lazy_backend()

    def lazy_arg(arg: Any) -> Any:
        return _lazy_zeros(node_value(arg))

    args = tree_map(lazy_arg, node.args)
    kwargs = dict(tree_map(lazy_arg, node.kwargs))
    if "device" in kwargs:
        kwargs["device"] = torch.device("lazy")
    ltc.reset_metrics()
    try:
        result = node.target(*args, **kwargs)
        tensors = [t for t in tree_leaves(result)
                   if isinstance(t, torch.Tensor)]
        ltc.sync_multi(tensors)
        fallbacks = ltc.fallback_ops()
    except Exception as exc:  # LTC asserts come as several exception types
        return f"{type(exc).__name__}: {first_line(exc, 200)}"
    finally:
        ltc.reset_metrics()
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
            logger.warning("cannot read the op-support record in the cache (LTC_CACHE_DIR) "
                           "(%s); probing again", exc)
            return
        if data is None:
            return
        known = _decode_record(data)
        if known is None:
            logger.warning("op-support record %s in the cache (LTC_CACHE_DIR) is unreadable; "
                           "probing again",
                           support_record_key())
            return
        self._known.update(known)

    def _save(self) -> None:
        if self._store is None or self._readonly:
            return
        try:
            self._store.put(support_record_key(), encode_support_record(self._known))
        except Exception as exc:
            logger.warning("cannot write the op-support record in the cache (LTC_CACHE_DIR) "
                           "(%s)", exc)

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
            if static_rules(node) is None:
                todo[signature] = node
        if not todo:
            return
        # Called from AOTAutograd's compilers with its FakeTensorMode active:
        # lazy tensors must be made outside it
        # (docs/torch/aot-autograd.md#lazy-tracing-fails-under-a-dispatch-mode). And outside the
        # Python dispatcher, whose kernel for native_batch_norm makes it an op LTC does not lower
        # (docs/torch/ltc.md#cnn-backward-lowers-more-than-probed). One probe at a time in a
        # process: LTC's fallback counts, which give the verdict, are process-wide
        # (ltc_cache/threads.py).
        with trace_lock, real_tensors(), python_dispatcher_disabled():
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
        rule = static_rules(node)
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


def encode_support_record(known: Mapping[str, str]) -> bytes:
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

