"""What the programs of one function (:class:`.programs.Programs`) ask of the
two routes a new input layout can take: one graph (:mod:`.single_graph`),
or several frames where Dynamo splits the function (:mod:`.frames`). A
route obtains a program for a layout; a program says whether it fits a
call, and runs it."""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

import torch

from ..entries.keys import CacheKey
from ..errors import UncacheableGraph
from ..graph.cache import GraphCache, default_cache
from .fallback import TorchCompileFallback
from .program_entries import program_key

__all__ = ["Call", "Program", "Route", "Target"]


class Call(NamedTuple):
    """One call of the function: the picture of its arguments that picks
    the programs to try (:func:`.loaded.call_layout`), the arguments, and
    the arguments with the module first (a module's forward)."""

    layout: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    full: tuple[Any, ...]


class Program(Protocol):
    def fits(self, call: Call) -> bool:
        """Whether this program's guards and checks hold for ``call``: the
        steady call's test, taking no lock."""
        ...

    def run(self, call: Call) -> Any:
        """The function's result for ``call``, computed by this program."""
        ...


class Route(Protocol):
    def obtain(self, call: Call, programs: list[Program]) -> Program | None:
        """A program for ``call``'s layout, loaded or captured, added to
        ``programs`` (the layout's, in the order they are tried) once it is
        ready to run; None where the layout goes to torch.compile (the
        route tells the fallback why). Called holding the compile lock."""
        ...


class Target:
    """What every route of one function shares: the function (a module's
    forward unbound), the module it is called with first (None for a plain
    function), its name in the log, ``torch.compile``'s arguments, the
    cache, and where a layout goes when no program serves it."""

    def __init__(self, fn: types.FunctionType, owner: Any, name: str,
                 compile_kwargs: Mapping[str, Any], fallback: TorchCompileFallback,
                 cache: GraphCache | None = None) -> None:
        self.fn = fn
        self.owner = owner
        self.name = name
        self.compile_kwargs = dict(compile_kwargs)
        self.fallback = fallback
        self._cache = cache
        # What the function's closure holds, as aot_compile saves it apart.
        self.closure = {f"ltc_cache.closure.{i}": cell.cell_contents
                        for i, cell in enumerate(fn.__closure__ or ())}

    @property
    def cache(self) -> GraphCache:
        return self._cache if self._cache is not None else default_cache()

    def key(self, call: Call) -> CacheKey | None:
        """The program key of ``call``; None (the layout goes to
        torch.compile) where the call cannot be keyed."""
        try:
            return program_key(self.fn, self.owner if isinstance(self.owner, torch.nn.Module)
                               else None, call.args, call.kwargs)
        except UncacheableGraph as exc:
            self.fallback.send(call.layout, str(exc))
            return None
