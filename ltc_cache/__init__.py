"""ltc_cache: a persistent, cross-process cache of PyTorch Lazy Tensor Core
compiled graphs."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Names resolve on first use: `ltc-cache ls` must not pay ~4 s of torch
# import for a listing that never touches torch.
_EXPORTS = {
    "CacheConfig": "config",
    "CompiledGraph": "replay",
    "CompiledModule": "compiled_module",
    "EntryError": "errors",
    "GraphCache": "cache",
    "LockTimeout": "errors",
    "LtcBackend": "dynamo",
    "UncacheableGraph": "errors",
    "backend": "dynamo",
    "compile": "precompile",
    "default_cache": "cache",
    "extract_compiled_graph": "cache",
    "stats": "cache",
}
__all__ = [
    "CacheConfig", "CompiledGraph", "CompiledModule", "EntryError", "GraphCache", "LockTimeout",
    "LtcBackend", "UncacheableGraph", "backend", "compile", "default_cache",
    "extract_compiled_graph", "stats",
]
__version__ = "0.1.0"

if TYPE_CHECKING:
    from .cache import GraphCache, default_cache, extract_compiled_graph, stats
    from .compiled_module import CompiledModule
    from .config import CacheConfig
    from .dynamo import LtcBackend, backend
    from .errors import EntryError, LockTimeout, UncacheableGraph
    from .precompile import compile
    from .replay import CompiledGraph


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ltc_cache' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
