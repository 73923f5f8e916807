"""``ltc_cache.compile`` of a model sharded with FSDP2 (``fully_shard``):
FSDP's hooks and the model's own code stay eager, around the forwards of
its blocks (and other weight-holding leaves) compiled.

``fully_shard(module)`` registers a forward pre-hook (all-gather the
module's parameters, set the unsharded ones on it, arm the reduce-scatter
that runs once its gradients are in) and a forward hook (reshard, hook the
outputs to all-gather again before their backward), both
``torch._dynamo.disable``-d: compiled whole through Dynamo, the model broke
its graph at every hook, and the frames between the breaks walked FSDP's
bookkeeping (docs/torch/distributed.md#fsdp2-hooks-are-dynamo-disabled). Here a call runs the model
as it is, hooks and all, with each **unit**'s ``forward`` its program for the
length of the call: from the model down, the first modules with no sharded
module below them that hold weights (each block, the embeddings, the final
norm, the head), each compiled by :func:`ltc_cache.compile` of its bound
method. A unit that is sharded is called by FSDP's hooks as eagerly: its
program runs after the pre-hook, on the unsharded parameters (plain
tensors, never the sharded DTensors), and its backward writes their
gradients, which FSDP's hook reduce-scatters. The code above the units
(the model's forward looping over its blocks, the loss) runs eagerly:
Dynamo cannot resume after a graph break inside a loop
(docs/torch/distributed.md#no-resume-after-break-in-a-loop).
"""

from __future__ import annotations

import functools
import logging
import types
from collections.abc import Callable
from typing import Any

import torch

from ..errors import BadArgument, first_line
from ..threads import SharedPatch
from .buckets import Buckets, pad_forward
from .compiled_module import (
    CompiledModule,
    class_named_like,
    forward_replaced,
    fsdp_module_class,
)

__all__ = ["CompiledFullyShardedModule", "compiled_fully_sharded", "compiled_units",
           "is_fully_sharded", "sharded_modules"]

logger = logging.getLogger("ltc_cache.precompile")


def sharded_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules under ``model`` (itself included) that ``fully_shard``
    has sharded, in ``modules()`` order."""
    fsdp = fsdp_module_class()
    if fsdp is None:
        return []
    return [module for module in model.modules() if isinstance(module, fsdp)]


def is_fully_sharded(model: Any) -> bool:
    return isinstance(model, torch.nn.Module) and bool(sharded_modules(model))


def _has_forward(module: torch.nn.Module) -> bool:
    # Containers (ModuleList, ModuleDict) are never called.
    return type(module).forward is not torch.nn.Module.forward


def _holds_weights(module: torch.nn.Module) -> bool:
    return any(True for _ in module.parameters()) or any(True for _ in module.buffers())


def compiled_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules whose forwards are programs: from ``model`` down, the
    first modules with no sharded module below them (a block, an
    embedding, the final norm, the head). A module above a sharded one
    (the model, the stack looping over its blocks) runs its own code
    eagerly, and its sharded modules' calls stay FSDP's. A module that
    holds no weights (a dropout, an activation) runs eagerly too: a
    program of it would only add its dispatch."""
    sharded = set(sharded_modules(model))
    above: dict[torch.nn.Module, bool] = {}  # module -> a sharded module is below it

    def holds_sharded_below(module: torch.nn.Module) -> bool:
        if module not in above:
            above[module] = any(child in sharded or holds_sharded_below(child)
                                for child in module.children())
        return above[module]

    units: list[torch.nn.Module] = []

    def visit(module: torch.nn.Module) -> None:
        if _has_forward(module) and not holds_sharded_below(module):
            if _holds_weights(module) and module not in units:
                units.append(module)
            return
        for child in module.children():
            visit(child)

    visit(model)
    return units


def _replaced(forwards: dict[torch.nn.Module, Callable[..., Any]]) -> Callable[[], None]:
    """Set each module's forward to its program; returns what puts the
    old ones back."""
    restores = [forward_replaced(module, forward) for module, forward in forwards.items()]

    def restore() -> None:
        for put_back in reversed(restores):
            put_back()

    return restore


class _ThroughFullyShardedModules:
    """A call of the stand-in: the model's own call, eager, with its
    units' forwards their programs while any call runs (threads calling
    at once share the replacement, which ends with the last of them)."""

    def __init__(self, model: torch.nn.Module,
                 forwards: dict[torch.nn.Module, Callable[..., Any]]) -> None:
        self.model = model
        self.forwards = forwards
        self._replaced = SharedPatch(lambda: _replaced(forwards))

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with self._replaced.held():
            return self.model(*args, **kwargs)


class CompiledFullyShardedModule(CompiledModule):
    """What :func:`ltc_cache.compile` returns for a model sharded with
    ``fully_shard``: a :class:`~ltc_cache.CompiledModule` of the model whose
    calls run the model's own call (FSDP's hooks) over its units' forwards
    compiled. Its class is made once per model class, named like it, with
    a ``forward`` that shows the model's signature (transformers reads
    both, as for any :class:`~ltc_cache.CompiledModule`)."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        through = self.__dict__["_ltc_programs"]
        return pad_forward(self.__dict__["_ltc_buckets"], through.model, args, kwargs, through)

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        through = self.__dict__["_ltc_programs"]
        return (compiled_fully_sharded, (through.model, self.__dict__["_ltc_compile_inner"],
                                         self.__dict__["_ltc_buckets"]))


def _unsharded_class(module: torch.nn.Module) -> type[torch.nn.Module]:
    """The module's class before ``fully_shard`` made it ``FSDP<class>``."""
    cls = type(module)
    fsdp = fsdp_module_class()
    if fsdp is None or not isinstance(module, fsdp):
        return cls
    return cls.__mro__[cls._orig_cls_mro_index]  # type: ignore[attr-defined]


class _AsUnsharded:
    """A unit's forward: its program, called while the module is of its
    own class, not FSDP's (docs/torch/distributed.md#sharded-program-guards-mro-by-index: a program
    guards its class's MRO by index, and saving such a guard failed under FSDP's class). FSDP's
    hooks run around this call, so none of them sees the class changed."""

    def __init__(self, module: torch.nn.Module, program: Callable[..., Any]) -> None:
        self._module = module
        self._program = program
        self._cls = _unsharded_class(module)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        module = self._module
        sharded_cls = module.__class__
        if sharded_cls is self._cls:
            return self._program(*args, **kwargs)
        module.__class__ = self._cls
        try:
            return self._program(*args, **kwargs)
        finally:
            module.__class__ = sharded_cls


@functools.cache
def _stand_in_class(cls: type[torch.nn.Module]) -> type[CompiledFullyShardedModule]:
    return class_named_like(CompiledFullyShardedModule, cls, lambda self, args, kwargs:
                            CompiledFullyShardedModule.forward(self, *args, **kwargs))


def _compiled_forwards(model: torch.nn.Module, compile_inner: Callable[[Any], Any]
                       ) -> dict[torch.nn.Module, Callable[..., Any]]:
    """Each unit's forward, compiled as the bound method of its own
    class's function (the instance's ``forward`` is the program while a
    call runs, and the programs call the class's)."""
    forwards: dict[torch.nn.Module, Callable[..., Any]] = {}
    for module in compiled_units(model):
        if "forward" in module.__dict__:
            raise BadArgument(f"{type(module).__name__} has a forward set on the instance")
        method = types.MethodType(_unsharded_class(module).forward, module)
        forwards[module] = _AsUnsharded(module, compile_inner(method))
    return forwards


def compiled_fully_sharded(model: torch.nn.Module, compile_inner: Callable[[Any], Any],
                           buckets: Buckets | None) -> CompiledModule | None:
    """The stand-in of ``model`` (sharded with ``fully_shard``, itself or
    modules under it), whose units' forwards ``compile_inner`` compiles
    (``ltc_cache.compile`` with the caller's arguments, no buckets), its
    calls padded to ``buckets``; None (the model is compiled as any module,
    through Dynamo) where they cannot be."""
    try:
        forwards = _compiled_forwards(model, compile_inner)
        through = _ThroughFullyShardedModules(model, forwards)
        stand_in = _stand_in_class(_unsharded_class(model))
        compiled = stand_in(model, through, buckets)  # type: ignore[arg-type]
    except Exception as exc:
        logger.info("%s: its sharded modules could not be compiled on their own (%s: %s); "
                    "its forward is compiled as it is", type(model).__name__,
                    type(exc).__name__, first_line(exc))
        return None
    compiled.__dict__["_ltc_compile_inner"] = compile_inner
    return compiled
