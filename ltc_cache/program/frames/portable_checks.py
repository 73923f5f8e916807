"""The portable checks of one frame of a program of frames (those standing in
for the guards Dynamo cannot save), as a lambda guard of the frame's guard
manager, and why a stored frame did not fit a call (logged after it)."""

from __future__ import annotations

import builtins
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import first_line
from ..guards import Checks

__all__ = ["PENDING_MISFITS", "FrameGuard", "add_checks", "log_misfits"]

logger = logging.getLogger("ltc_cache.precompile")


# Why stored frames did not fit, logged once the call is over.
PENDING_MISFITS: list[str] = []


def log_misfits(name: str) -> None:
    while PENDING_MISFITS:
        logger.info("%s: a stored frame does not fit this call (%s); Dynamo captures that "
                    "frame again", name, PENDING_MISFITS.pop(0))


class FrameGuard:
    """The portable checks of one frame, as a lambda guard of its guard
    manager: resolved against the first call that reaches it (objects
    described as recorded), then the identity checks they compile to."""

    def __init__(self, checks: Sequence[Any], f_globals: dict[str, Any]) -> None:
        self._checks = Checks(checks)
        self._globals = f_globals
        self._failed = False
        self._resolving = threading.Lock()  # resolved once, whatever the threads
        # Checks of builtins read them through the dict Dynamo names so.
        for name in self._checks.builtins_dicts:
            f_globals.setdefault(name, builtins.__dict__)

    def __call__(self, f_locals: Mapping[str, Any]) -> bool:
        fast = self._checks.fast
        if fast is not None:
            return fast(f_locals, self._globals)
        with self._resolving:
            return self._resolve(f_locals)

    def _resolve(self, f_locals: Mapping[str, Any]) -> bool:
        fast = self._checks.fast  # another thread's call may have resolved them
        if fast is not None:
            return fast(f_locals, self._globals)
        if self._failed:
            return False
        try:
            why = self._checks.resolve(f_locals, self._globals)
        except Exception as exc:  # a check that cannot be built: never run the frame
            why = f"{type(exc).__name__}: {first_line(exc)}"
        if why is not None:
            self._failed = True
            # Logged after the call: a guard runs inside the eval-frame hook,
            # which would visit the logger's frames.
            PENDING_MISFITS.append(why)
            return False
        return True


def add_checks(guard_manager: Any, checks: Sequence[Any], f_globals: dict[str, Any]) -> None:
    """Add a frame's portable checks to its guard manager (none: nothing)."""
    if checks:
        guard_manager.root.add_lambda_guard(FrameGuard(checks, f_globals),
                                            ["ltc_cache portable checks"], None)
