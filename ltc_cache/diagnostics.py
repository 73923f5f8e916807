"""This process's cache counters, the recorder that also counts an event in
a store's ledger, and warnings that are given once."""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import sys
import threading
import warnings
from collections import Counter
from pathlib import Path
from typing import Protocol

from .counter_names import (
    AOT_TRACES,
    ERRORS,
    HITS,
    MISSES,
    PLAN_HITS,
    PLAN_MISSES,
    STORES,
    TRACES,
)

__all__ = [
    "BACKEND_EVENTS",
    "COUNTER_NAMES",
    "LEDGER_EVENTS",
    "EventRecorder",
    "ProcessCounters",
    "count_event",
    "counters",
    "warn_once",
]

logger = logging.getLogger("ltc_cache")

# Every counter is declared, with what it counts, in counter_names.py.
COUNTER_NAMES = (HITS, MISSES, TRACES, STORES, ERRORS)
# Events of the torch.compile backend: AOTAutograd traces that ran, graphs
# built from a stored plan instead, and plan lookups that found none.
BACKEND_EVENTS = (AOT_TRACES, PLAN_HITS, PLAN_MISSES)
# What a store's ledger counts as well as the process, for ``ltc-cache
# stats``; the other counters (aten ops, negative hits, ...) are per process.
LEDGER_EVENTS = frozenset((*COUNTER_NAMES, *BACKEND_EVENTS))


class ProcessCounters:
    """Thread-safe event counts; ``snapshot()`` always has every COUNTER_NAMES key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._warned: set[str] = set()

    def bump(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._counts[name] += amount

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {name: 0 for name in COUNTER_NAMES} | dict(self._counts)

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()
            self._warned.clear()

    def first_time(self, topic: str) -> bool:
        with self._lock:
            new = topic not in self._warned
            self._warned.add(topic)
            return new


# One per process by design: ``ltc_cache.stats()`` reports the process.
counters = ProcessCounters()


class EventRecorder(Protocol):
    """What keeps counts across processes: a store (``Store.record``), named
    by shape so that this ground module imports no layer above it."""

    def record(self, event: str, key: str | None) -> None: ...


def count_event(event: str, store: EventRecorder | None = None, key: str | None = None
                ) -> None:
    """Count one ``event`` (of entry ``key``) for this process and, where
    it is one of LEDGER_EVENTS, in ``store``'s ledger. Every such event is
    counted through here, so ``ltc_cache.stats()`` and ``ltc-cache stats``
    agree; counts kept for the process only (aten ops, ...) may bump
    ``counters`` directly. ``store`` is None where there is none, or where
    it must not be written."""
    counters.bump(event)
    if store is not None and event in LEDGER_EVENTS:
        store.record(event, key)


def warn_once(topic: str, message: str) -> None:
    """Warn the first time ``topic`` comes up in this process; later ones go
    to the DEBUG log only.

    A cache problem is never fatal, but a user should hear of it once, not
    once per compiled graph.
    """
    logger.debug("%s", message)
    if counters.first_time(topic):
        warnings.warn(f"ltc_cache: {message}", RuntimeWarning, stacklevel=_caller_level())


# Frames of these packages are skipped: a warning points at the user's line
# (the compiled call, the torch.compile'd forward), not at ltc_cache's or
# torch's own code, which the user can do nothing about.
@functools.cache
def _library_dirs() -> tuple[str, ...]:
    torch = importlib.util.find_spec("torch")  # finds, does not import
    files = [__file__, *([torch.origin] if torch and torch.origin else [])]
    return tuple({os.path.dirname(path) + os.sep for f in files
                  for path in (os.path.abspath(f), str(Path(f).resolve()))})


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside ltc_cache and torch,
    as ``warnings.warn`` counts from warn_once."""
    skipped = (*_library_dirs(), "<frozen ")
    frame, level = sys._getframe(2), 2  # 1: warn_once, 2: who called it
    while frame is not None and frame.f_code.co_filename.startswith(skipped):
        frame, level = frame.f_back, level + 1
    return level
