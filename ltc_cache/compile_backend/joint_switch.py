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
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from .joint import JointFunction, JointLayout

if TYPE_CHECKING:
    from torch import fx

    from .partition import Partitioned

logger = logging.getLogger(__name__)

__all__ = ["JointOnceMade", "PlanInProgress", "StoredForward", "joint_once_made"]


class StoredForward(NamedTuple):
    """A training forward graph stored in its plan's wire form, waiting for
    its backward: the wire form, the graph as the plan rebuilds it, and
    AOTAutograd's metadata of it (which the joint layout is made from)."""

    wire: dict[str, Any]
    rebuilt: Partitioned
    metadata: Any


class PlanInProgress:
    """A training plan while AOTAutograd makes it. AOTAutograd compiles the
    forward graph first (:meth:`forward_made`), then the backward, which
    takes the forward (:meth:`take_forward`) to store the plan; once it is
    stored, :meth:`joint_made` hands the forward and backward modules the
    plan runs, and their layout, to :class:`JointOnceMade`
    (:meth:`take_joint`)."""

    __slots__ = ("_forward", "_joint", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._forward: StoredForward | None = None
        self._joint: tuple[fx.GraphModule, fx.GraphModule, JointLayout] | None = None

    def forward_made(self, forward: StoredForward) -> None:
        with self._lock:
            self._forward = forward

    def take_forward(self) -> StoredForward | None:
        """The forward waiting for its backward, once; None where it has no plan."""
        with self._lock:
            forward, self._forward = self._forward, None
            return forward

    def joint_made(self, forward: fx.GraphModule, backward: fx.GraphModule,
                   layout: JointLayout) -> None:
        with self._lock:
            self._joint = (forward, backward, layout)

    def take_joint(self) -> tuple[fx.GraphModule, fx.GraphModule, JointLayout] | None:
        """The stored plan's modules and layout, once; None until it is stored."""
        with self._lock:
            joint, self._joint = self._joint, None
            return joint


class JointOnceMade:
    """Calls ``aot`` (AOTAutograd's compiled function) until ``made`` holds
    the plan's forward module, backward module and layout, then
    ``wrap(JointFunction(...), aot)`` from then on: ``wrap`` guards the
    first call of the new path, falling back to ``aot`` should it fail."""

    __slots__ = ("_aot", "_call", "_made", "_wrap")

    def __init__(self, aot: Callable[..., Any], made: PlanInProgress,
                 wrap: Callable[[Callable[..., Any], Callable[..., Any]], Callable[..., Any]]
                 ) -> None:
        self._aot = aot
        self._made = made
        self._wrap = wrap
        self._call: Callable[..., Any] = self._until_made

    def __call__(self, *args: Any) -> Any:
        return self._call(*args)

    def _until_made(self, *args: Any) -> Any:
        joint = self._made.take_joint()
        if joint is None:
            return self._aot(*args)
        forward, backward, layout = joint
        logger.debug("training plan made: the steps from now on run through JointFunction")
        self._call = self._wrap(JointFunction(forward, backward, layout), self._aot)
        return self._call(*args)


def joint_once_made(aot: Callable[..., Any], made: PlanInProgress,
                    wrap: Callable[[Callable[..., Any], Callable[..., Any]], Callable[..., Any]]
                    ) -> Callable[..., Any]:
    """``aot`` until the plan is made, then its ``JointFunction`` (see the
    module's docstring); the switch ``tools/bench/steady.py --ab
    joint-cold`` turns off."""
    return JointOnceMade(aot, made, wrap)
