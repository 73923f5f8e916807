"""Every use ltc_cache makes of LTC's private Python and C++ surface.

Lazy Tensor Core has no public API: its C++ bindings (``torch._C._lazy``,
``torch._C._lazy_ts_backend``), the Python modules over them
(``torch._lazy`` and its ``computation``, ``debug``, ``metrics``,
``ts_backend`` and ``extract_compiled_graph``), and the functionalization
hooks a trace syncs views with (``torch._sync``,
``torch._is_functional_tensor``) are all torch-private. This module is the
one place in the package that touches them (``tests/common/test_layers.py``
holds every other module to that), so that a torch upgrade that moves one
breaks here, and ``tests/common/test_torch_private.py`` (its LTC section)
is where it breaks first, by name.

Written against torch 2.13. ``torch._lazy`` is imported by the functions
that need it, not here: the cache keys read LTC's settings on every
lookup, and a warm process that only reads the cache never loads
``torch._lazy`` (``tests/graph/test_warm_imports.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import fx

__all__ = ["backend_registered", "dump_ir", "fallback_ops", "force_fallback",
           "force_lazy_device", "graph_hash", "init_ts_backend", "reset_metrics",
           "symbolic_shape_mode", "sync_functional", "sync_multi", "tensor_id",
           "ts_device_data"]


def force_fallback() -> str:
    """The ops LTC is told to leave to eager (``LTC_FORCE_FALLBACK``)."""
    return torch._C._lazy._get_force_fallback()


def symbolic_shape_mode() -> bool:
    """Whether LTC traces with symbolic shapes."""
    return torch._C._lazy._get_symbolic_shape_mode()


def backend_registered() -> bool:
    """Whether an LTC backend is registered in this process."""
    try:
        torch._C._lazy._get_default_device_type()
    except RuntimeError:  # "Lazy tensor backend not registered."
        return False
    return True


def init_ts_backend() -> None:
    """Register LTC's TorchScript backend (raises where one already is)."""
    import torch._lazy.ts_backend

    torch._lazy.ts_backend.init()


def force_lazy_device(model: fx.GraphModule) -> None:
    """Point ``model``'s factory calls at the lazy device, in place."""
    from torch._lazy.extract_compiled_graph import force_lazy_device as force

    force(model)


def reset_metrics() -> None:
    """Zero LTC's process-wide counters, the fallback counts among them."""
    import torch._lazy.metrics

    torch._lazy.metrics.reset()


def fallback_ops() -> list[str]:
    """The aten ops that fell back to eager since the counters were last
    reset, each as ``"aten::op=count"``."""
    from torch._lazy.extract_compiled_graph import get_fallback_ops

    return get_fallback_ops()


def tensor_id(t: torch.Tensor) -> int:
    """LTC's id of lazy tensor ``t``; an in-place op gives it a new one."""
    import torch._lazy

    return torch._lazy.get_tensor_id(t)


def sync_multi(tensors: Sequence[torch.Tensor]) -> None:
    """Compile and run the graph that computes ``tensors``."""
    import torch._lazy

    torch._lazy.sync_multi(list(tensors), [])


def sync_functional(values: Sequence[Any]) -> None:
    """Sync each functionalized tensor of ``values``: a write through a
    view reaches its base, and a view of an updated base sees the update,
    only once the tensor is synced."""
    for t in values:
        if isinstance(t, torch.Tensor) and torch._is_functional_tensor(t):
            torch._sync(t)


def dump_ir(tensors: Sequence[torch.Tensor]) -> str:
    """The TorchScript graph (backend IR) that computes ``tensors``."""
    from torch._lazy import debug

    return debug.dump_ir(list(tensors), "backend")


def ts_device_data(tensors: Sequence[torch.Tensor]) -> tuple[list[int], list[Any]]:
    """The ids and values of the device data the graph computing
    ``tensors`` takes as parameters, in the graph's order."""
    from torch._lazy import computation

    return computation.get_tensors_ts_device_data_node(list(tensors))


def graph_hash(tensors: Sequence[torch.Tensor]) -> bytes:
    """LTC's hash of the graph that computes ``tensors``."""
    from torch._lazy import computation

    return computation.get_graph_hash(list(tensors))
