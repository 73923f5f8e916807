"""Byte-level storage tiers behind one small interface.

Features are added by wrapping a store, not by flags on it.
"""

from .base import Store
from .disk import DiskStore
from .memory import MemoryStore
from .redis import RedisStore  # imports the optional redis package only when made
from .tiered import TieredStore

__all__ = ["DiskStore", "MemoryStore", "RedisStore", "Store", "TieredStore"]
