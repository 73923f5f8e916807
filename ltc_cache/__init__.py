"""ltc_cache: a persistent, cross-process cache of PyTorch Lazy Tensor Core
compiled graphs."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The public names, each with the module it comes from: the one list of
# them (``__all__`` is its keys; the imports below, for type checkers, are
# checked against it by tests/common/test_public_api.py). Names resolve on
# first use: `ltc-cache ls` must not pay ~4 s of torch import for a listing
# that never touches torch.
_EXPORTS = {
    "Buckets": "program.buckets",
    "CacheConfig": "config",
    "CompiledGraph": "graph.replay",
    "CompiledModule": "program.compiled_module",
    "EntryError": "errors",
    "GraphCache": "graph.cache",
    "LockTimeout": "errors",
    "LtcBackend": "compile_backend.backend",
    "LtcCacheError": "errors",
    "UncacheableGraph": "errors",
    "backend": "program.backend_route",
    "compile": "program.precompile",
    "default_cache": "graph.cache",
    "extract_compiled_graph": "graph.cache",
    "stats": "graph.cache",
}
__all__ = list(_EXPORTS)
__version__ = "0.1.0"

if TYPE_CHECKING:
    # ``X as X``: an explicit re-export, which type checkers honour without
    # reading __all__.
    from .compile_backend.backend import LtcBackend as LtcBackend
    from .config import CacheConfig as CacheConfig
    from .errors import EntryError as EntryError
    from .errors import LockTimeout as LockTimeout
    from .errors import LtcCacheError as LtcCacheError
    from .errors import UncacheableGraph as UncacheableGraph
    from .graph.cache import GraphCache as GraphCache
    from .graph.cache import default_cache as default_cache
    from .graph.cache import extract_compiled_graph as extract_compiled_graph
    from .graph.cache import stats as stats
    from .graph.replay import CompiledGraph as CompiledGraph
    from .program.backend_route import backend as backend
    from .program.buckets import Buckets as Buckets
    from .program.compiled_module import CompiledModule as CompiledModule
    from .program.precompile import compile as compile


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ltc_cache' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
