"""A cold process's training graph runs the way a warm one does once its
training plan is made.

A cold process traces a training graph through AOTAutograd, whose runtime
wrappers (``CompiledFunction`` and ``CompiledFunctionBackward``) then run
every step: in a training step of the small GPT of BENCHMARKS.md they cost
~2% more process CPU time than :class:`~ltc_cache.compile_backend.joint.JointFunction`, the
wrapper a warm process rebuilds from the stored plan. The plan is complete
once AOTAutograd has compiled the backward graph (with the forward, where
the backend asks it to: before the first step; else on the first
backward); from the next call on, :class:`JointOnceMade` runs the plan's
own forward and backward modules (the very ones AOTAutograd's wrapper
calls, regions already extracted) through ``JointFunction``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .joint import JointFunction, JointLayout

logger = logging.getLogger(__name__)

__all__ = ["JointOnceMade", "joint_once_made"]


class JointOnceMade:
    """Calls ``aot`` (AOTAutograd's compiled function) until ``made`` holds
    the plan's ``"joint"`` (forward module, backward module, layout), then
    ``wrap(JointFunction(...), aot)`` from then on: ``wrap`` guards the
    first call of the new path, falling back to ``aot`` should it fail."""

    __slots__ = ("_aot", "_call", "_made", "_wrap")

    def __init__(self, aot: Callable[..., Any], made: dict[str, Any],
                 wrap: Callable[[Callable[..., Any], Callable[..., Any]], Callable[..., Any]]
                 ) -> None:
        self._aot = aot
        self._made = made
        self._wrap = wrap
        self._call: Callable[..., Any] = self._until_made

    def __call__(self, *args: Any) -> Any:
        return self._call(*args)

    def _until_made(self, *args: Any) -> Any:
        joint: tuple[Any, Any, JointLayout] | None = self._made.pop("joint", None)
        if joint is None:
            return self._aot(*args)
        forward, backward, layout = joint
        logger.debug("training plan made: the steps from now on run through JointFunction")
        self._call = self._wrap(JointFunction(forward, backward, layout), self._aot)
        return self._call(*args)


def joint_once_made(aot: Callable[..., Any], made: dict[str, Any],
                    wrap: Callable[[Callable[..., Any], Callable[..., Any]], Callable[..., Any]]
                    ) -> Callable[..., Any]:
    """``aot`` until the plan is made, then its ``JointFunction`` (see the
    module's docstring); the switch ``tools/bench_steady.py --ab
    joint-cold`` turns off."""
    return JointOnceMade(aot, made, wrap)
