"""A compile's time limit (``LTC_CACHE_FUSE_TIMEOUT``), counted in the time
the compile ran: the worker's governor stops its compile processes
(SIGSTOP) while a client steps (:mod:`.governor`), and a wall-clock alarm
counted those pauses too. GPT-2 small's whole-plan libraries were refused
as "over 900 s" after a 7-minute cold run had kept them stopped.

A thread ticks every :data:`_TICK` seconds; a gap of over :data:`_STOPPED`
between two ticks was a stop (a thread of a running process is scheduled
far sooner than that, GIL or not: Python hands the GIL over every 5 ms),
and the alarm, when it goes off, arms itself again for what is left of the
running time.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from ...errors import CompileTimeout

__all__ = ["running_deadline"]

_TICK = 0.1
_STOPPED = 1.0


class _RunningClock:
    """Seconds since it started, less the time the process was stopped."""

    def __init__(self) -> None:
        self._start = self._last = time.monotonic()
        self._stopped = 0.0
        self._done = threading.Event()
        threading.Thread(target=self._tick, name="ltc_cache-deadline", daemon=True).start()

    def _tick(self) -> None:
        while not self._done.wait(_TICK):
            now = time.monotonic()
            if now - self._last > _STOPPED:
                self._stopped += now - self._last - _TICK
            self._last = now

    def running(self) -> float:
        now = time.monotonic()
        unseen = now - self._last - _TICK if now - self._last > _STOPPED else 0.0
        return now - self._start - self._stopped - unseen

    def stop(self) -> None:
        self._done.set()


@contextlib.contextmanager
def running_deadline(seconds: float | None) -> Iterator[None]:
    """Raise :class:`CompileTimeout` in the block once it has run
    ``seconds`` (stops not counted); no limit without ``seconds``, or off
    the main thread (where no signal is delivered)."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return
    clock = _RunningClock()

    def expired(signum: int, frame: Any) -> None:
        left = seconds - clock.running()
        if left > _TICK:  # it was stopped for part of the time: the rest
            signal.setitimer(signal.ITIMER_REAL, left)
            return
        raise CompileTimeout

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        clock.stop()
