"""Models for the core tests: the original extract_compiled_graph's corner
cases plus the ones ltc_cache adds. Imported by the tests and by the child
processes they start, so both build the same graphs."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import fx, nn


class ConstScale(nn.Module):
    def forward(self, a):
        return a * 2


class Sub(nn.Module):
    def forward(self, a, b):
        return a - b


class Addcmul(nn.Module):
    def forward(self, a, b, c):
        return torch.addcmul(a, b, c, value=5)


class ReturnMulti(nn.Module):
    def forward(self, a, b):
        return b + 1, a - 1


class ReturnDupTensor(nn.Module):
    def forward(self, a, b):
        c = a + b
        return a - b, c, a + 1, c


class InplaceUpdate(nn.Module):
    def forward(self, a, b):
        a.sub_(b)
        return b - 1, b + 1


class ReturnsInput(nn.Module):
    """Returns an argument unchanged and one updated in place."""

    def forward(self, a, b):
        b.mul_(3)
        return a, b, a * b


class NoneAndValues(nn.Module):
    def forward(self, a):
        return a + 1, None, 3, "tag"


class NoOutputs(nn.Module):
    def forward(self, a):
        a.add_(1)
        return ()


class TensorConstant(nn.Module):
    """A plain tensor attribute (neither parameter nor buffer)."""

    def __init__(self):
        super().__init__()
        self.offset = torch.arange(4.0)

    def forward(self, a):
        return a + self.offset


class Factory(nn.Module):
    """A factory call the trace must force onto the lazy device."""

    def forward(self, a):
        return a + torch.ones(4) * 0.5


class DataOutput(nn.Module):
    """Returns a tensor made from data inside the graph: on the lazy device
    it holds data and no IR node, which LTC's dump leaves out of the graph's
    results and inputs unless it is given one."""

    def forward(self, x):
        return x * 2, x.new_tensor([1.0, 2.0]), x + 1


class NegativeSlice(nn.Module):
    """A slice bound out of range below, as a sliding-window cache keeps its
    last 4095 positions of 3: LTC writes it as a one-element tensor
    constant, whose sign parse_ir drops."""

    def forward(self, x):
        return x[:, -4095:] * 2, x[:, -2:] + 1


class MaxDim(nn.Module):
    """LTC types max.dim's result as a NamedTuple, which parse_ir refuses."""

    def forward(self, a):
        values, indices = torch.max(a, 1)
        return values * 2, indices


class Weighted(nn.Module):
    """Parameters and a buffer updated in place (BatchNorm's running stats)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.norm = nn.BatchNorm1d(3)

    def forward(self, a):
        return torch.relu(self.norm(self.linear(a))) * 1.5


# name -> (module factory, shapes of the random inputs)
CASES: dict[str, tuple[Callable[[], nn.Module], list[tuple[int, ...]]]] = {
    "const_scale": (ConstScale, [(2, 3)]),
    "sub": (Sub, [(2, 3), (2, 3)]),
    "addcmul": (Addcmul, [(2, 3), (2, 3), (2, 3)]),
    "return_multi": (ReturnMulti, [(2, 3), (2, 3)]),
    "return_dup_tensor": (ReturnDupTensor, [(2, 3), (2, 3)]),
    "inplace_update": (InplaceUpdate, [(2, 3), (2, 3)]),
    "returns_input": (ReturnsInput, [(2, 3), (2, 3)]),
    "none_and_values": (NoneAndValues, [(2, 3)]),
    "no_outputs": (NoOutputs, [(2, 3)]),
    "tensor_constant": (TensorConstant, [(3, 4)]),
    "factory": (Factory, [(3, 4)]),
    "max_dim": (MaxDim, [(3, 4)]),
    "data_output": (DataOutput, [(2, 3)]),
    "negative_slice": (NegativeSlice, [(2, 3)]),
    "weighted": (Weighted, [(5, 4)]),
}
ORIGINAL_CASES = ["const_scale", "sub", "addcmul", "return_multi", "return_dup_tensor",
                  "inplace_update"]


def build(name: str, seed: int = 0) -> tuple[fx.GraphModule, list[tuple[int, ...]]]:
    factory, shapes = CASES[name]
    torch.manual_seed(seed)
    return fx.symbolic_trace(factory()), shapes


def random_inputs(shapes: list[tuple[int, ...]], seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=gen) for shape in shapes]


def as_list(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def check_against_eager(gm: fx.GraphModule, compiled, shapes, ncase: int = 10,
                        seed: int = 100) -> None:
    """Compare outputs and arguments after the call with eager on ``ncase``
    random inputs; raises AssertionError on the first difference. Module
    state (BatchNorm's running stats) must move in step as well."""
    import copy

    eager_model = copy.deepcopy(gm)
    for case in range(ncase):
        eager_args = random_inputs(shapes, seed + case)
        compiled_args = [a.clone() for a in eager_args]
        expected = as_list(eager_model(*eager_args))
        actual = compiled(*compiled_args)
        assert isinstance(actual, list), type(actual)
        assert len(actual) == len(expected), (len(actual), len(expected))
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            if isinstance(e, torch.Tensor):
                torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6,
                                           msg=lambda m, i=i: f"output {i}: {m}")
            else:
                assert a == e, (i, a, e)
        for i, (e, a) in enumerate(zip(eager_args, compiled_args, strict=True)):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6,
                                       msg=lambda m, i=i: f"argument {i} after the call: {m}")
        for (name, e), a in zip(eager_model.state_dict().items(), gm.state_dict().values(),
                                strict=True):
            torch.testing.assert_close(a, e, msg=lambda m, n=name: f"state {n}: {m}")
