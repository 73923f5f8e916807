"""Byte-level storage tiers behind one small interface.

Features are added by wrapping a store, not by flags on it.
"""

from .base import Store
from .disk import DiskStore
from .memory import MemoryStore

__all__ = ["DiskStore", "MemoryStore", "Store"]
