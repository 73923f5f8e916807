"""The programs of one compiled function: which to run for a call, a route
that loads or captures one for a new input layout (one graph:
:mod:`.single_graph`; several frames where Dynamo splits the function:
:mod:`.frames`), and the fallback to ``torch.compile(backend="ltc_cache")``
(:mod:`.fallback`)."""

from __future__ import annotations

import logging
import types
from collections.abc import Mapping
from typing import Any

import torch

from ..errors import GrowingLayout
from ..graph.cache import GraphCache
from ..threads import compile_lock
from .fallback import TorchCompileFallback
from .frames import FramesRoute
from .kv_cache import with_fresh_layers
from .loaded import call_layout
from .route import Call, Program, Route, Target
from .single_graph import SingleGraphRoute

__all__ = ["Programs"]

logger = logging.getLogger("ltc_cache.precompile")


class Programs:
    """The programs of one function (``fn``, called with ``owner`` first
    where it is a module's forward), one or more per input layout."""

    def __init__(self, fn: types.FunctionType, owner: Any, name: str,
                 compile_kwargs: Mapping[str, Any], fallback_target: Any,
                 cache: GraphCache | None = None) -> None:
        self._fallback = TorchCompileFallback(name, fallback_target, compile_kwargs)
        self._target = Target(fn, owner, name, compile_kwargs, self._fallback, cache)
        self._by_layout: dict[Any, list[Program]] = {}
        self._growing = False
        # True once a call with a DynamicCache stand-in failed (kv_cache.py).
        self._fresh_layers_tried: bool | None = None
        # One route at a time takes new layouts: one graph, until Dynamo
        # splits the function (then the frames, while they work).
        self._frames = FramesRoute(self._target, self._abandon)
        self._single = SingleGraphRoute(self._target, self._frames)

    @property
    def cache(self) -> GraphCache:
        return self._target.cache

    @property
    def fn(self) -> types.FunctionType:
        """The function the programs compute (a module's forward unbound)."""
        return self._target.fn

    @property
    def compile_kwargs(self) -> dict[str, Any]:
        """``torch.compile``'s arguments the programs were made with."""
        return self._target.compile_kwargs

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            layout = (torch.is_grad_enabled(), call_layout(args), call_layout(kwargs))
        except GrowingLayout as exc:
            if self._fresh_layers_tried is not True:
                return self._with_fresh_layers(args, kwargs, exc)
            return self._growing_layout(args, kwargs, exc)
        owner = self._target.owner
        call = Call(layout, args, kwargs, (owner, *args) if owner is not None else args)
        program = self._pick(call)  # the steady call: no lock
        if program is None:
            if layout in self._fallback:
                return self._fallback(args, kwargs)
            # One load or capture a layout: threads calling together wait for
            # the first, then run what it made (ltc_cache/threads.py).
            with compile_lock():
                program = self._pick(call)
                if program is None and layout not in self._fallback:
                    program = self._route().obtain(call, self._by_layout.setdefault(layout, []))
            if program is None:
                return self._fallback(args, kwargs)
        return program.run(call)

    def _with_fresh_layers(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                           growing: GrowingLayout) -> Any:
        """A call given a ``DynamicCache`` whose layers it writes are empty
        (a training forward's block): its program runs with a stand-in for
        the cache (:mod:`.kv_cache`); other calls go to torch.compile, as
        any whose layout grows."""
        used: list[bool] = []

        def run(new_args: tuple[Any, ...], new_kwargs: dict[str, Any]) -> Any:
            used.append(True)
            return self(new_args, new_kwargs)

        def again(same_args: tuple[Any, ...], same_kwargs: dict[str, Any]) -> Any:
            if used:  # the stand-in did not do: never tried again for this function
                self._fresh_layers_tried = True
            return self._growing_layout(same_args, same_kwargs, growing)

        return with_fresh_layers(self._target.owner, args, kwargs, run, again)

    def _growing_layout(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                        growing: GrowingLayout) -> Any:
        """A call whose layout changes every call, through torch.compile
        (said once a function)."""
        if not self._growing:
            self._growing = True
            logger.info("%s: called with a %s, whose layout changes every call; running "
                        "it through torch.compile(backend=\"ltc_cache\")",
                        self._target.name, growing)
        return self._fallback(args, kwargs)

    def _pick(self, call: Call) -> Program | None:
        """The program of the call's layout whose guards and checks hold
        for it; None where none does."""
        for program in self._by_layout.get(call.layout, ()):
            if program.fits(call):
                return program
        return None

    def _route(self) -> Route:
        """The route a new layout takes: the frames, once the function runs
        as frames (Dynamo's guards pick among them, and new ones are
        stored); else one graph."""
        return self._frames if self._frames.active else self._single

    def _abandon(self, program: Program) -> None:
        """Every layout of the function goes to torch.compile from now on,
        and ``program`` runs for none (it failed). Called holding the
        compile lock."""
        for layout in list(self._by_layout):
            self._fallback.layouts.add(layout)
            self._by_layout[layout] = [p for p in self._by_layout[layout] if p is not program]
