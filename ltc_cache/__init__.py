"""ltc_cache: a persistent, cross-process cache of PyTorch Lazy Tensor Core
compiled graphs."""

from .cache import GraphCache, default_cache, extract_compiled_graph, stats
from .config import CacheConfig
from .errors import EntryError, LockTimeout, UncacheableGraph
from .replay import CompiledGraph

__all__ = [
    "CacheConfig",
    "CompiledGraph",
    "EntryError",
    "GraphCache",
    "LockTimeout",
    "UncacheableGraph",
    "default_cache",
    "extract_compiled_graph",
    "stats",
]
__version__ = "0.1.0"
