"""Byte-level storage tiers behind one small interface.

Features are added by wrapping a store, not by flags on it; a directory read
without writing is a store of its own (ReadOnlyDiskStore).
"""

from .base import MemoryStore, Store
from .disk import DiskStore
from .readonly import ReadOnlyDiskStore
from .redis import RedisStore  # imports the optional redis package only when made
from .tiered import TieredStore
from .tiers import Tiers, open_directory, open_tiers

__all__ = ["DiskStore", "MemoryStore", "ReadOnlyDiskStore", "RedisStore", "Store",
           "TieredStore", "Tiers", "open_directory", "open_tiers"]
