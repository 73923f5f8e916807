"""Vision training inside LTC (docs/torch/ltc.md#roll-and-copy-do-not-lower,
docs/torch/ltc.md#hardsigmoid-backward-does-not-lower, docs/torch/ltc.md#flash-attention-stays-eager
and docs/torch/aot-autograd.md#running-statistics-written-in-one-call): Swin's ``roll`` and the
functional ``copy`` of its pooler's backward, GhostNet's hard-sigmoid gradient, decomposed into ops
LTC lowers, equal to eager's kernels; BatchNorm's running statistics written by one
``_foreach_copy_``; and a small model with all of them trains in two LTC regions (one forward, one
backward), its gradients and running statistics as eager's."""

from __future__ import annotations

import copy

import pytest
import torch
from test_compile_backend import fresh_backend
from torch import fx

import ltc_cache
from ltc_cache.compile_backend.buffer_writes import buffer_writes_as_one
from ltc_cache.compile_backend.decompose_vision import vision_decompositions

aten = torch.ops.aten


def test_hardsigmoid_gradient_equals_eager():
    edges = torch.tensor([float("nan"), -4.0, -3.0, -2.9, 0.0, 2.9, 3.0, 4.0])
    x = torch.cat([edges.repeat(8), torch.randn(64) * 5])
    grad = torch.randn_like(x)
    got = vision_decompositions()[aten.hardsigmoid_backward.default](grad, x)
    want = aten.hardsigmoid_backward.default(grad, x)
    assert torch.equal(got, want)


@pytest.mark.parametrize("shifts, dims", [
    ([1, 1], [1, 2]), ([-1, -2], [2, 1]), ([7], [0]), ([0], [1]), ([3], []), ([-5], [-1]),
    ([4], [2]),  # a whole turn: nothing moves
])
def test_roll_equals_eager(shifts, dims):
    x = torch.randn(3, 4, 4, 2)
    got = vision_decompositions()[aten.roll.default](x, shifts, dims)
    assert torch.equal(got, aten.roll.default(x, shifts, dims))
    assert got.data_ptr() != x.data_ptr()  # a new tensor, as roll's


def test_functional_copy_equals_eager():
    x = torch.zeros(2, 3, 4, dtype=torch.float64)
    source = torch.randn(3, 1)
    got = vision_decompositions()[aten.copy.default](x, source)
    want = aten.copy.default(x, source)
    assert got.dtype == want.dtype and torch.equal(got, want)
    # Eager's result keeps a strided destination's layout: that one stays whole.
    assert vision_decompositions()[aten.copy.default](x.transpose(0, 2), source.t()) \
        is NotImplemented


def _writes_graph(destinations: list[int]) -> fx.GraphModule:
    graph = fx.Graph()
    buffers = [graph.placeholder(f"b{i}") for i in range(3)]
    x = graph.placeholder("x")
    new = graph.call_function(aten.add.Tensor, (x, 1))
    for i in destinations:
        graph.call_function(aten.copy_.default, (buffers[i], new))
    graph.output((new,))
    return fx.GraphModule(torch.nn.Module(), graph)


def test_trailing_buffer_writes_become_one_call():
    gm = _writes_graph([0, 2, 1])
    assert buffer_writes_as_one(gm.graph)
    gm.recompile()
    ops = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert ops == [aten.add.Tensor, aten._foreach_copy_.default]
    buffers = [torch.zeros(2), torch.zeros(2), torch.zeros(2)]
    gm(*buffers, torch.ones(2))
    assert all(torch.equal(b, torch.full((2,), 2.0)) for b in buffers)


def test_a_buffer_written_twice_keeps_its_writes():
    gm = _writes_graph([0, 0])
    assert not buffer_writes_as_one(gm.graph)
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"].count(
        aten.copy_.default) == 2


class ShiftedGhost(torch.nn.Module):
    """Swin's shifted windows (``roll``) and GhostNet's ghost module, hard-
    sigmoid gate and BatchNorm, small."""

    def __init__(self) -> None:
        super().__init__()
        self.primary = torch.nn.Conv2d(3, 4, 1, bias=False)
        self.bn = torch.nn.BatchNorm2d(4)
        self.cheap = torch.nn.Conv2d(4, 4, 3, padding=1, groups=4, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(4)
        self.gate = torch.nn.Conv2d(8, 8, 1)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.primary(x)))
        x = torch.cat([x, torch.relu(self.bn2(self.cheap(x)))], dim=1)
        x = x * torch.nn.functional.hardsigmoid(self.gate(x.mean((2, 3), keepdim=True)))
        x = torch.roll(x, (1, -1), (2, 3))
        return self.head(torch.roll(x, (-1, 1), (2, 3)).mean((2, 3)))


@pytest.mark.usefixtures("dynamo_reset")
def test_ghost_and_shifted_windows_train_in_two_regions(cache_dir):
    torch.manual_seed(0)
    model, x = ShiftedGhost().train(), torch.randn(2, 3, 6, 6) * 3
    eager = copy.deepcopy(model)
    eager(x).square().mean().backward()
    before = ltc_cache.stats()
    torch.compile(model, backend=fresh_backend())(x).square().mean().backward()
    for got, want in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-5, atol=1e-6)
    for got, want in zip(model.buffers(), eager.buffers(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)  # running statistics
    stats = {k: v - before.get(k, 0) for k, v in ltc_cache.stats().items()}
    # Only the buffers' writes stay eager: one _foreach_copy_ for both layers.
    assert stats["aten_ops"] - stats["ltc_ops"] == 1, stats
    assert stats["hits"] + stats["misses"] == 2, stats
