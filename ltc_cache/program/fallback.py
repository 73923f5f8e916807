"""Where a function's calls go when no program serves them:
``torch.compile(backend="ltc_cache")`` of the function, compiled on first use,
and the input layouts sent there for good."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..counter_names import PROGRAM_FALLBACKS
from ..diagnostics import counters
from ..threads import compile_lock

__all__ = ["TorchCompileFallback"]

logger = logging.getLogger("ltc_cache.precompile")


class TorchCompileFallback:
    """``torch.compile(target, backend="ltc_cache", **compile_kwargs)`` for
    the calls of function ``name`` that no program serves, and the input
    layouts that go there for good."""

    def __init__(self, name: str, target: Any, compile_kwargs: Mapping[str, Any]) -> None:
        self._name = name
        self._target = target
        self._kwargs = dict(compile_kwargs)
        self._compiled: Callable[..., Any] | None = None
        self.layouts: set[Any] = set()

    def __contains__(self, layout: Any) -> bool:
        return layout in self.layouts

    def send(self, layout: Any, why: str) -> None:
        """Send ``layout`` to torch.compile from now on, saying why."""
        logger.info("%s: %s; running it through torch.compile(backend=\"ltc_cache\")",
                    self._name, why)
        self.layouts.add(layout)

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        counters.bump(PROGRAM_FALLBACKS)
        compiled = self._compiled
        if compiled is None:
            from ..compile_backend.backend import backend

            with compile_lock():
                if self._compiled is None:
                    self._compiled = torch.compile(self._target, backend=backend,
                                                   **self._kwargs)
                compiled = self._compiled
        return compiled(*args, **kwargs)
