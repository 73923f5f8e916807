"""How ``python -m tools.bench.replay`` times its variants: interleaved
rounds, best and median per call, and the units of its tables."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


@dataclasses.dataclass
class Timing:
    rounds: list[float] = dataclasses.field(default_factory=list)  # seconds per call

    @property
    def best(self) -> float:
        return min(self.rounds)

    @property
    def median(self) -> float:
        return statistics.median(self.rounds)


def interleaved(variants: dict[str, Callable[[], Any]], *, rounds: int, calls: int,
                warmup: int = 3, clock: Callable[[], float] = time.perf_counter
                ) -> dict[str, Timing]:
    """Time each variant in ``rounds`` rounds of ``calls`` calls, one round of
    every variant after the other, by ``clock``."""
    for fn in variants.values():
        for _ in range(warmup):
            fn()
    timings = {name: Timing() for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            start = clock()
            for _ in range(calls):
                fn()
            timings[name].rounds.append((clock() - start) / calls)
    return timings


def us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} us"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.3f} ms"


def ratio(a: Timing, b: Timing) -> str:
    return f"{a.median / b.median:.2f}x ({a.best / b.best:.2f}x)"


def without_optimize(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` with the TorchScript executor's optimisation off, as replay calls a graph."""
    def run() -> Any:
        torch._C._set_graph_executor_optimize(False)
        try:
            return fn()
        finally:
            torch._C._set_graph_executor_optimize(True)
    return run
