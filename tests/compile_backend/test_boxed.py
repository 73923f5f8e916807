"""The boxed backward: a graph called on a list frees each input after its
last use (``ltc_cache.compile_backend.boxed``)."""

from __future__ import annotations

import weakref

import torch
from torch import fx

from ltc_cache.compile_backend.boxed import boxed


class _Probe(torch.nn.Module):
    """Records, when called, whether the tensor it watches is still alive."""

    def __init__(self) -> None:
        super().__init__()
        self.watched: weakref.ref | None = None
        self.alive_when_called: bool | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.watched is not None
        self.alive_when_called = self.watched() is not None
        return x * 2


class _Graph(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.probe = _Probe()

    def forward(self, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        total = first.sum()  # the last use of ``first``
        return self.probe(second) + total


def _traced() -> fx.GraphModule:
    # The probe is called as a submodule, as a plan calls its regions.
    class Tracer(fx.Tracer):
        def is_leaf_module(self, m: torch.nn.Module, name: str) -> bool:
            return isinstance(m, _Probe) or super().is_leaf_module(m, name)

    root = _Graph()
    return fx.GraphModule(root, Tracer().trace(root))


def test_a_boxed_graph_frees_an_input_after_its_last_use_and_empties_the_list():
    graph = _traced()
    inputs = [torch.randn(4), torch.randn(4)]
    graph.probe.watched = weakref.ref(inputs[0])
    graph(*inputs)
    assert graph.probe.alive_when_called  # called unboxed, the caller holds it

    call = boxed(graph)
    first, second = torch.randn(4), torch.randn(4)
    want = second * 2 + first.sum()
    inputs = [first, second]
    graph.probe.watched = weakref.ref(first)
    del first, second
    got = call(inputs)
    assert inputs == []
    assert graph.probe.alive_when_called is False
    torch.testing.assert_close(got, want)


def test_a_callable_that_is_no_graph_is_called_on_the_list_items():
    assert boxed(lambda a, b: a - b)([5, 3]) == 2


def test_the_torch_fx_code_generator_it_relies_on():
    """torch.fx's private boxed code generator (torch 2.13): a function of
    one list that it empties. Fails loudly when torch moves it."""
    from torch.fx.graph import _BoxedCodeGen

    graph = fx.Graph()
    graph.output(graph.placeholder("x"))
    graph.set_codegen(_BoxedCodeGen())
    code = fx.GraphModule(torch.nn.Module(), graph).code
    assert "def forward(self, args_list)" in code and "args_list.clear()" in code
