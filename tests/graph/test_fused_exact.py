"""The float64 arbiter of a library's build check (no compiler needed): a
library that parts from the reference by float32 rounding is kept, one
that computes something else, or that cannot be judged, is not."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ltc_cache.graph.fused.exact import no_further_from_exact


def _deep(x: torch.Tensor, *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
    # Random unit-normal weights: activations grow with each layer, as in a
    # build's check, and two summation orders part visibly.
    for w in weights:
        x = torch.tanh(x @ w) * 30
    return (x.sum(-1), x)


def _inputs() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(16, 256, generator=generator)] + [
        torch.randn(256, 256, generator=generator) for _ in range(4)]


def test_rounding_is_kept_and_a_wrong_result_is_not() -> None:
    inputs = _inputs()
    graph = make_fx(_deep)(*inputs)
    expected = _deep(*inputs)
    # The same sum in another order, in float32: it differs by rounding.
    chunked = (sum(x.sum(-1) for x in expected[1].split(64, dim=-1)), expected[1])
    assert not torch.equal(chunked[0], expected[0])
    assert no_further_from_exact(graph, inputs, [], expected, chunked)
    scale = expected[0].abs().max()
    # float32 itself is 0.5 off here (7e-4 of the largest): a wrong result is further.
    for wrong in (expected[0] * 1.01, expected[0] + 3e-3 * scale):
        assert not no_further_from_exact(graph, inputs, [], expected, (wrong, expected[1]))
    transposed = expected[1].t().contiguous().t()  # the same values, other strides
    assert not no_further_from_exact(graph, inputs, [], expected, (expected[0], transposed))
    nan = expected[1].clone()
    nan[0, 0] = float("nan")
    assert not no_further_from_exact(graph, inputs, [], expected, (expected[0], nan))


def test_written_inputs_are_judged_too() -> None:
    def writes(buffer: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        buffer.copy_(buffer * 0.9 + x.mean(0) * 0.1)
        return (x * 2,)

    inputs = [torch.ones(8), torch.randn(4, 8)]
    graph = make_fx(writes)(*[t.clone() for t in inputs])
    fresh = [t.clone() for t in inputs]
    expected = (*writes(*fresh), fresh[0])
    assert no_further_from_exact(graph, inputs, [0], expected, expected)
    assert not no_further_from_exact(graph, inputs, [0], expected,
                                     (expected[0], expected[1] + 0.5))


def test_outputs_that_are_no_tensors_must_be_equal() -> None:
    def counted(x: torch.Tensor) -> tuple[object, ...]:
        return (x * 2, 3)

    x = torch.randn(4)
    graph = make_fx(counted)(x)
    assert no_further_from_exact(graph, [x], [], counted(x), counted(x))
    assert not no_further_from_exact(graph, [x], [], counted(x), (x * 2, 4))


def test_a_complex_output_is_not_judged_so_must_be_equal() -> None:
    def spectrum(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.fft.rfft(x),)

    x = torch.randn(8)
    graph = make_fx(spectrum)(x)
    assert no_further_from_exact(graph, [x], [], spectrum(x), spectrum(x))
    assert not no_further_from_exact(graph, [x], [], spectrum(x), (spectrum(x)[0] * 1.01,))


def test_a_graph_with_no_float64_run_is_not_judged() -> None:
    fixed = torch.randn(8, 8)

    def constant(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x @ fixed,)

    x = torch.randn(2, 8)
    graph = make_fx(constant)(x)  # the constant stays float32: mm(double, float) raises
    expected = constant(x)
    assert not no_further_from_exact(graph, [x], [], expected, expected)


def _scaled(x: torch.Tensor, *weights: torch.Tensor) -> tuple[torch.Tensor, ...]:
    summed, deep = _deep(x, *weights)
    return (summed * x[:, 0], deep)  # an infinite x[i, 0] makes sum i infinite


def test_infinities_both_sides_share_are_left_out_of_the_errors() -> None:
    """Where the reference, the library and the float64 run all hold the same
    infinity, the errors are taken over the finite elements: rounding there
    is kept, a wrong finite element still refused."""
    inputs = _inputs()
    inputs[0][0, 0], inputs[0][1, 0] = float("inf"), float("-inf")
    graph = make_fx(_scaled)(*inputs)
    expected = _scaled(*inputs)
    assert torch.isinf(expected[0]).sum() == 2
    chunked = (sum(x.sum(-1) for x in expected[1].split(64, dim=-1)) * inputs[0][:, 0],
               expected[1])
    assert no_further_from_exact(graph, inputs, [], expected, chunked)
    wrong = expected[0].clone()
    wrong[5] *= 2
    assert not no_further_from_exact(graph, inputs, [], expected, (wrong, expected[1]))
