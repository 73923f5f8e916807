"""ltc_cache: a persistent, cross-process cache of PyTorch Lazy Tensor Core
compiled graphs."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Names resolve on first use: `ltc-cache ls` must not pay ~4 s of torch
# import for a listing that never touches torch.
_EXPORTS = {
    "Buckets": "program.buckets",
    "CacheConfig": "config",
    "CompiledGraph": "graph.replay",
    "CompiledModule": "program.compiled_module",
    "EntryError": "errors",
    "GraphCache": "graph.cache",
    "LockTimeout": "errors",
    "LtcBackend": "compile_backend.backend",
    "UncacheableGraph": "errors",
    "backend": "compile_backend.backend",
    "compile": "program.precompile",
    "default_cache": "graph.cache",
    "extract_compiled_graph": "graph.cache",
    "stats": "graph.cache",
}
__all__ = [
    "Buckets", "CacheConfig", "CompiledGraph", "CompiledModule", "EntryError", "GraphCache",
    "LockTimeout", "LtcBackend", "UncacheableGraph", "backend", "compile", "default_cache",
    "extract_compiled_graph", "stats",
]
__version__ = "0.1.0"

if TYPE_CHECKING:
    from .compile_backend.backend import LtcBackend, backend
    from .config import CacheConfig
    from .errors import EntryError, LockTimeout, UncacheableGraph
    from .graph.cache import GraphCache, default_cache, extract_compiled_graph, stats
    from .graph.replay import CompiledGraph
    from .program.buckets import Buckets
    from .program.compiled_module import CompiledModule
    from .program.precompile import compile


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ltc_cache' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
