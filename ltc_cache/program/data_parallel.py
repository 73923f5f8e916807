"""``ltc_cache.compile(DDP(model))``: DistributedDataParallel's forward stays
eager, around the module it wraps, compiled.

DDP's forward is bookkeeping for its reducer (buffers to broadcast, buckets
to rebuild, the autograd hooks to arm), with nothing to compile, and its
Python path changes from one iteration to the next: the first forward runs
its lazy set-up, the second rebuilds the buckets and logs it,
``no_sync()`` skips the reduction. Compiled through Dynamo it was a program
of frames (DDP's forward breaks the graph at each of its calls Dynamo
cannot trace), and a warm rank met frames the cold one had never visited
or stored (docs/torch/distributed.md#ddp-forward-has-nothing-to-compile). Here a call runs DDP's own
forward with the module it wraps stood in for, for the length of the call, by that
module compiled with :func:`ltc_cache.compile`, as ``DDP(ltc_cache.compile(model))``
is written: the module's program is loaded warm, DDP's reducer hooks the
same parameters and reduces the gradients the compiled backward produces.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from ..errors import first_line
from ..threads import SharedPatch
from .compiled_module import CompiledModule

__all__ = ["CompiledDataParallel", "compiled_data_parallel", "is_data_parallel"]

logger = logging.getLogger("ltc_cache.precompile")


def is_data_parallel(model: Any) -> bool:
    ddp = getattr(torch.nn.parallel, "DistributedDataParallel", None)
    return ddp is not None and isinstance(model, ddp)


class _ThroughDataParallel:
    """A call of the stand-in: DDP's forward, eager, with its module the
    compiled one while any call runs (threads calling at once share the
    replacement, which ends with the last of them)."""

    def __init__(self, ddp: torch.nn.Module, inner: torch.nn.Module) -> None:
        self.ddp = ddp
        self.inner = inner
        self._replaced = SharedPatch(lambda: _module_replaced(ddp, inner))

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with self._replaced.held():
            return self.ddp(*args, **kwargs)


def _module_replaced(ddp: torch.nn.Module, inner: torch.nn.Module) -> Callable[[], None]:
    # DDP reads its module as ``self.module``: the registered child.
    modules = ddp._modules
    before = modules["module"]
    modules["module"] = inner

    def restore() -> None:
        modules["module"] = before

    return restore


class CompiledDataParallel(CompiledModule):
    """What :func:`ltc_cache.compile` returns for a ``DistributedDataParallel``:
    a :class:`~ltc_cache.CompiledModule` whose ``_orig_mod`` is the DDP
    (``no_sync()``, ``module`` and the other attributes are its own), and
    whose calls run DDP's forward over the wrapped module compiled."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.__dict__["_ltc_programs"](args, kwargs)

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        through = self.__dict__["_ltc_programs"]
        return (compiled_data_parallel, (through.ddp, self.__dict__["_ltc_compile_inner"]))


def compiled_data_parallel(ddp: torch.nn.Module, compile_inner: Callable[[torch.nn.Module], Any]
                           ) -> CompiledModule | None:
    """The stand-in of ``ddp``, whose module ``compile_inner`` compiles
    (``ltc_cache.compile`` with the caller's arguments); None (``ddp`` is
    compiled as any module, its forward through Dynamo) where its module
    is not where DDP keeps it or cannot be compiled so."""
    module = ddp._modules.get("module")
    if not isinstance(module, torch.nn.Module):
        logger.info("%s: no module at .module; its forward is compiled as it is",
                    type(ddp).__name__)
        return None
    try:
        inner = compile_inner(module)
        through = _ThroughDataParallel(ddp, inner)
        compiled = CompiledDataParallel(ddp, through)  # type: ignore[arg-type]
    except Exception as exc:
        logger.info("%s: its module could not be compiled on its own (%s: %s); its forward "
                    "is compiled as it is", type(ddp).__name__, type(exc).__name__,
                    first_line(exc))
        return None
    compiled.__dict__["_ltc_compile_inner"] = compile_inner
    return compiled
