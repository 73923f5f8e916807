"""``ltc_cache.compile``: ``torch.compile(model, backend="ltc_cache")`` whose
warm start skips Dynamo too.

The first call with a new input layout looks up a **program** for it
(:mod:`ltc_cache.program.program_entries`): what Dynamo's AOT precompile
(``torch.compile(fn, fullgraph=True).aot_compile``) made of the function, its
transformed bytecode, its guards, and the FX graph the ltc_cache backend
compiles. A hit loads it with no capture and no trace: the graph goes
through the backend on the first call, where its LTC graphs (and, for
inference, its partitioning plan) are cache hits. A miss captures, stores
the program, and runs what a later process would load.

What keeps a program from being stale or wrong:

- its key: the torch and Python versions, grad mode, the input layouts, the
  compiled function, and the module's structure (classes, train/eval flags,
  tensor layouts);
- the source of every function Dynamo inlined, recorded at capture and
  compared on load (Dynamo records checksums but never compares them);
- Dynamo's guards, checked on every call; those Dynamo cannot save (object
  identities) are replaced by checks of what the object is (a class,
  function, module by name and code), on load and on every call;
- a signature (HMAC-SHA256, a key outside the cache directory) checked
  before the artifact, a pickle, is unpickled.

A changed source, a failing guard or a program that does not load is
captured again (and stored again: for a failing guard, beside the layout's
other programs, never over one). A ``DistributedDataParallel`` keeps its
forward eager around its module compiled
(:mod:`ltc_cache.program.data_parallel`). A function Dynamo cannot capture whole
(a graph break) is compiled as several frames and stored as a program of
frames (:mod:`ltc_cache.program.frames`); one whose program cannot be saved runs
through ``torch.compile(backend="ltc_cache")`` as before, with one INFO line.
"""

from __future__ import annotations

import functools
import logging
import types
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar, overload

import torch

from ..counter_names import PROGRAM_CAPTURES, PROGRAM_FALLBACKS, PROGRAM_HITS, PROGRAM_LOOKUPS
from ..dynamo_package import traced_fn
from ..errors import WrongType
from .buckets import Buckets, pad_forward, resolve
from .compiled_module import CompiledModule, stand_in
from .data_parallel import compiled_data_parallel, is_data_parallel
from .fully_sharded import compiled_fully_sharded, is_fully_sharded
from .programs import Programs

__all__ = ["PROGRAM_CAPTURES", "PROGRAM_FALLBACKS", "PROGRAM_HITS", "PROGRAM_LOOKUPS",
           "CompiledModule", "compile", "compile_again"]

logger = logging.getLogger("ltc_cache.precompile")


# torch.compile's arguments besides the backend.
_COMPILE_KWARGS = frozenset({"fullgraph", "dynamic", "mode", "options", "disable"})


_F = TypeVar("_F", bound=Callable[..., Any])


class _Compiler(Protocol):
    """What :func:`compile` returns called with no model (as a decorator
    with arguments): it compiles what it is given, as :func:`compile` does."""

    @overload
    def __call__(self, model: torch.nn.Module, /) -> CompiledModule: ...

    @overload
    def __call__(self, model: _F, /) -> _F: ...


@overload
def compile(model: torch.nn.Module, *, buckets: Buckets | str | None = ...,
            **kwargs: Any) -> CompiledModule: ...


@overload
def compile(model: _F, *, buckets: Buckets | str | None = ..., **kwargs: Any) -> _F: ...


@overload
def compile(model: None = None, *, buckets: Buckets | str | None = ...,
            **kwargs: Any) -> _Compiler: ...


def compile(model: Any = None, *, buckets: Buckets | str | None = "auto", **kwargs: Any) -> Any:
    """``torch.compile(model, backend="ltc_cache", **kwargs)``, whose warm
    start loads the whole compiled program: no Dynamo capture, no LTC trace.

    Takes a module (returns a :class:`~ltc_cache.program.compiled_module.CompiledModule`,
    a stand-in for it that training loops take for the module) or a function
    (returns a function), and works as a decorator, with or without
    arguments; any other callable goes to ``torch.compile`` as it is.
    ``kwargs`` are ``torch.compile``'s (``fullgraph``, ``dynamic``,
    ``mode``, ``options``, ``disable``), used where a call goes through
    ``torch.compile``: ``dynamic=True``, or a program that cannot be saved.
    A function Dynamo compiles as several frames (graph breaks) is a program
    of frames (:mod:`ltc_cache.program.frames`).

    ``buckets`` (a transformers model, or its ``forward``): sequence lengths,
    and ``generate()``'s batch sizes, padded up to a few sizes, so that a
    bounded set of programs serves any length (:mod:`ltc_cache.program.buckets`):
    ``"auto"`` (the default ladders), an :class:`~ltc_cache.Buckets`, or
    None to compile every length as it comes.
    """
    unknown = set(kwargs) - _COMPILE_KWARGS
    if unknown:
        raise WrongType(f"ltc_cache.compile() got unexpected arguments {sorted(unknown)} "
                        "(it always uses the ltc_cache backend)")
    padding = resolve(buckets)
    if model is None:
        return functools.partial(compile, buckets=buckets, **kwargs)
    if kwargs.get("disable"):
        return model
    if isinstance(model, CompiledModule) or hasattr(model, "_ltc_programs"):
        return model  # compiled already
    if is_data_parallel(model):
        # DDP's forward stays eager, its module is compiled
        # (docs/torch/distributed.md#ddp-forward-has-nothing-to-compile): as
        # DDP(ltc_cache.compile(model)).
        compiled = compiled_data_parallel(model, functools.partial(compile, buckets=buckets,
                                                                   **kwargs))
        if compiled is not None:
            return compiled
    if is_fully_sharded(model):
        # FSDP2's hooks and the model's loop over its blocks stay eager,
        # each block (and other weight-holding leaf) is a program
        # (docs/torch/distributed.md#fsdp2-hooks-are-dynamo-disabled).
        compiled = compiled_fully_sharded(
            model, functools.partial(compile, buckets=None, **kwargs), padding)
        if compiled is not None:
            return compiled
    if isinstance(model, torch.nn.Module):
        fn, owner = traced_fn(model)
        name = type(model).__name__
        # What falls back to torch.compile is the function the programs
        # run, bound, not the module: a forward replaced after this (Lightning
        # wraps it with the stand-in's) would call the programs again.
        fallback = types.MethodType(fn, owner) if owner is not None else fn
        programs = Programs(fn, owner, name, kwargs, fallback)
        return stand_in(model, programs, padding, dict(kwargs, buckets=buckets), compile_again)
    if isinstance(model, types.FunctionType):
        programs = Programs(model, None, model.__qualname__, kwargs, model)

        @functools.wraps(model)
        def compiled(*args: Any, **kw: Any) -> Any:
            return programs(args, kw)

        compiled._ltc_programs = programs  # type: ignore[attr-defined]
        return compiled
    if isinstance(model, types.MethodType) and isinstance(model.__self__, torch.nn.Module) \
            and isinstance(model.__func__, types.FunctionType):
        # ``model.forward = ltc_cache.compile(model.forward)``, as transformers
        # documents compiling for generate(): programs of the module's method.
        method, owner = model.__func__, model.__self__
        programs = Programs(method, owner, type(owner).__name__, kwargs, model)

        @functools.wraps(method)
        def compiled_method(*args: Any, **kw: Any) -> Any:
            return pad_forward(padding, owner, args, kw, programs)

        compiled_method._ltc_programs = programs  # type: ignore[attr-defined]
        return compiled_method
    # Other callables: what torch.compile takes, compiled as it does (no
    # program: Dynamo captures in every process).
    logger.info("ltc_cache.compile: a %s is compiled with torch.compile(backend=\"ltc_cache\")",
                type(model).__name__)
    from ..compile_backend.backend import backend

    return torch.compile(model, backend=backend, **kwargs)


def compile_again(model: Any, compile_kwargs: Mapping[str, Any]) -> Any:
    """``compile(model, **compile_kwargs)``: how a module's stand-in
    pickles (and deep-copies), and how it compiles its module's forward for
    ``generate()`` (:mod:`ltc_cache.program.compiled_module`)."""
    return compile(model, **compile_kwargs)
