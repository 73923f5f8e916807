"""specialize: a static Dynamo graph and a symbolic one at the same shape come
out as the same graph (so they share keys), and compute what the model does."""

from __future__ import annotations

import pytest
import torch

from ltc_cache.compile_backend.specialize import scalar_inputs, specialize
from ltc_cache.errors import Unspecializable
from ltc_cache.graph.graph_keys import compute_key

pytestmark = pytest.mark.usefixtures("dynamo_reset")


class Reshaping(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.scale = 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        h = self.proj(x).view(batch * length, width) * self.scale
        return h.view(batch, length, width).sum(1) + torch.arange(length).sum()


def graphs(dynamic: bool | None, lengths: list[int]):
    """(graph, example inputs, real inputs) of each graph Dynamo compiles."""
    captured = []

    def backend(gm, example_inputs):
        def run(*args):
            captured.append((gm, example_inputs, args))
            return gm.forward(*args)
        return run

    model = Reshaping()
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    for length in lengths:
        x = torch.randn(2, length, 8)
        torch.testing.assert_close(compiled(x), model(x))
    return model, captured


def test_static_and_symbolic_graphs_share_one_form():
    model, captured = graphs(None, [5, 7, 5])  # static for 5, then symbolic
    (static, static_examples, _), _, (symbolic, _, args) = captured
    assert any(isinstance(n.meta.get("example_value"), torch.SymInt)
               for n in symbolic.graph.nodes)
    from_static, kept_static = specialize(static, static_examples, drop_unused=False)
    from_symbolic, kept = specialize(symbolic, args)
    assert from_symbolic.code == from_static.code
    real = [args[i] for i in kept]
    assert compute_key(from_symbolic, real).digest == compute_key(from_static, real).digest
    torch.testing.assert_close(from_symbolic(*real)[0], model(args[kept[0]]))
    assert len(kept_static) == len(static_examples)  # nothing dropped under Dynamo's context


def test_dynamic_true_folds_item_of_inputs_and_reads_their_values():
    model, captured = graphs(True, [5])
    gm, _, args = captured[0]
    scalars = scalar_inputs(gm)
    assert scalars, gm.code  # self.scale reaches the graph as a tensor read with .item()
    specialized, kept = specialize(gm, args)
    assert not set(scalars) & set(kept)
    assert "item" not in specialized.code and "0.5" in specialized.code
    x = next(a for a in args if isinstance(a, torch.Tensor) and a.dim() == 3)
    torch.testing.assert_close(specialized(*[args[i] for i in kept])[0], model(x))


def test_a_value_of_tensor_data_is_refused():
    gm = torch.fx.symbolic_trace(Reshaping())
    with pytest.raises(Unspecializable):
        specialize(gm, [torch.randn(2, 5, 8), torch.randn(1)])
