"""The float64 arbiter of a library's build check.

A library is checked at build time against the function it stands in for,
on random inputs (:mod:`.build`). Random weights make activations grow
with each layer's width, and two correct float32 programs that sum in
different orders can then part by more than the check's tolerance: T5's
training forward by 1.2e-3 of its largest value. Which of the two is
wrong? The graph run in float64 says: where the library is no further
from it than the reference is, the difference is float32's rounding, not
a miscompile, and the library is kept. This is the rule Dynamo's own
accuracy checks apply (``torch._dynamo.utils.same`` with ``fp64_ref``):
root mean square errors against the float64 run, the library's at most a
few times the reference's.

The library's first call on a run's own inputs is still compared with the
reference at 1e-5 (:mod:`.verdicts`); this only decides what is built.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import torch

from ...fx_ops import tree_map
from .runner import ATOL, layout_mismatch, same_non_finite

__all__ = ["no_further_from_exact"]

logger = logging.getLogger("ltc_cache.fused")

# How much further from the float64 run than the reference a library may
# be (Dynamo's checks use 2 to 3, more for tiny tensors); a miscompile is
# orders of magnitude further.
_MULTIPLIER = 3.0
# Below this, an error is rounding of unit-scale values.
_FLOOR = ATOL


def no_further_from_exact(graph: torch.fx.GraphModule, inputs: Sequence[Any],
                          writes: Sequence[int], expected: Sequence[Any],
                          got: Sequence[Any]) -> bool:
    """Whether every floating output in ``got`` (the library's outputs,
    then the inputs it wrote at ``writes``) is no further from ``graph``
    run in float64 on ``inputs`` than ``expected`` (the reference's) is.
    False where the graph cannot run in float64, where anything but
    floating values differs (:func:`~.runner.layout_mismatch`), where an
    output's NaNs and infinities differ from the reference's, or where a
    complex output differs at all (it is not widened)."""
    try:
        exact = _in_float64(graph, inputs, writes)
    except Exception as exc:  # an op with no float64 kernel, a fixed dtype
        logger.info("no float64 run to compare with: %s", exc)
        return False
    if not len(exact) == len(expected) == len(got):
        return False
    for i, (e, g, x) in enumerate(zip(expected, got, exact, strict=True)):
        if layout_mismatch(i, e, g) is not None:
            return False  # only floating values are judged here
        if not isinstance(e, torch.Tensor) or not (e.is_floating_point() or e.is_complex()):
            continue
        if e.is_complex():  # not widened, so not judged: equal or refused
            if not torch.equal(e, g):
                return False
            continue
        reference, library, scale = _errors(e, g, x, None, e.numel())
        if not math.isfinite(reference + library + scale):  # a NaN or an infinity in one
            if not same_non_finite(e, g):
                return False
            known = torch.isfinite(e) & torch.isfinite(x)
            reference, library, scale = _errors(e, g, x, known, int(known.sum()))
        if library > _MULTIPLIER * reference + _FLOOR * scale:
            logger.info("the library's error against float64 is %.3g, the reference's %.3g",
                        library, reference)
            return False
    return True


def _in_float64(graph: torch.fx.GraphModule, inputs: Sequence[Any],
                writes: Sequence[int]) -> list[Any]:
    """``graph``'s outputs, then the inputs it writes, with its float32
    inputs and every float32 it names widened to float64."""
    def wide(value: Any) -> Any:
        return torch.float64 if value is torch.float32 else value

    copied = torch.fx.Graph()
    copied.output(copied.graph_copy(graph.graph, {}))
    for node in copied.nodes:
        node.args, node.kwargs = tree_map(wide, node.args), tree_map(wide, node.kwargs)
    widened = torch.fx.GraphModule(graph, copied)
    wide_inputs = [t.detach().to(torch.float64) if isinstance(t, torch.Tensor)
                   and t.dtype == torch.float32 else t.detach().clone()
                   if isinstance(t, torch.Tensor) else t for t in inputs]
    with torch.no_grad():
        outputs = widened(*wide_inputs)
    outputs = list(outputs if isinstance(outputs, tuple | list) else [outputs])
    return outputs + [wide_inputs[i] for i in writes]


def _errors(e: torch.Tensor, g: torch.Tensor, x: torch.Tensor, where: torch.Tensor | None,
            count: int) -> tuple[float, float, float]:
    """The reference's and the library's root mean square errors against
    the float64 run, and the float64 run's own, over ``where`` (None: all;
    where all three are finite, every element is)."""
    return _rms(e, x, where, count), _rms(g, x, where, count), _rms(x, None, where, count)


def _rms(a: torch.Tensor, b: torch.Tensor | None, where: torch.Tensor | None,
         count: int) -> float:
    """The root mean square of ``a - b`` (``a`` where ``b`` is None) over the
    ``count`` elements ``where`` holds (None: all), in float64. ``b`` is the
    float64 run's: subtracting it promotes without a float64 copy of ``a``,
    and the norm reads the differences in place (the outputs of GPT-2
    small's training forward, compared this way by masked copies, took 24 s)."""
    if not count:
        return 0.0
    diff = a.double() if b is None else a - b.double()  # (b is float64: no copy)
    if where is not None:
        diff = diff.where(where, 0.0)
    return torch.linalg.vector_norm(diff, dtype=torch.float64).item() / math.sqrt(count)
