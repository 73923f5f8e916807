"""BatchNorm CNN training inside LTC: the vision decompositions
(ltc_cache.compile_backend.decompose_vision) compute what eager's kernels do
(that AOTAutograd keeps a buffer's update in the training graph,
docs/torch/aot-autograd.md#buffer-updates-stay-in-training-graph, is pinned in
tests/common/test_torch_private.py), and a small CNN's training step (BatchNorm, ReLU6, Hardswish,
an indexed bias) runs in two LTC regions, its running statistics updated as eager's, and is stored
as a training plan that the next start runs without AOTAutograd."""

from __future__ import annotations

import copy

import pytest
import torch
from test_compile_backend import fresh_backend

import ltc_cache
from ltc_cache.compile_backend.decompose_vision import vision_decompositions

aten = torch.ops.aten


def _same(got: torch.Tensor, want: torch.Tensor) -> bool:
    return torch.equal(torch.nan_to_num(got, 1234.0), torch.nan_to_num(want, 1234.0))


def _edges() -> torch.Tensor:
    """Values at and around the kernels' thresholds, NaN among them, long
    enough for their vectorised loops."""
    edges = torch.tensor([float("nan"), -4.0, -3.0, -1.0, 0.0, 3.0, 4.0, 6.0, 7.0])
    return torch.cat([edges.repeat(8), torch.randn(64) * 5])


@pytest.mark.parametrize("op, args", [
    (aten.hardtanh.default, (0.0, 6.0)),
    (aten.hardswish.default, ()),
])
def test_activations_equal_eager(op, args):
    x = _edges()
    assert _same(vision_decompositions()[op](x, *args), op(x, *args))


@pytest.mark.parametrize("op, args", [
    (aten.hardtanh_backward.default, (0.0, 6.0)),
    (aten.hardswish_backward.default, ()),
])
def test_activation_gradients_equal_eager(op, args):
    x = _edges()
    grad = torch.randn_like(x)
    assert _same(vision_decompositions()[op](grad, x, *args), op(grad, x, *args))


@pytest.mark.parametrize("which", ["one", "two adjacent", "leading", "last"])
def test_indexing_and_its_accumulating_put_equal_eager(which):
    torch.manual_seed(0)
    x = torch.randn(3, 7, 2)
    rows, cols = torch.randint(-7, 7, (4, 5)), torch.randint(0, 2, (5,))
    indices = {"one": [None, rows], "two adjacent": [None, rows, cols],
               "leading": [torch.randint(-3, 3, (4,))], "last": [None, None, cols]}[which]
    table = vision_decompositions()
    want = aten.index.Tensor(x, indices)
    assert torch.equal(table[aten.index.Tensor](x, indices), want)
    values = torch.randn(want.shape)
    torch.testing.assert_close(table[aten.index_put.default](x, indices, values, True),
                               aten.index_put.default(x, indices, values, True),
                               rtol=1e-6, atol=1e-6)


def test_indexing_they_do_not_cover_keeps_the_op():
    x = torch.randn(3, 7, 2)
    rows, cols = torch.randint(0, 3, (5,)), torch.randint(0, 2, (5,))
    table = vision_decompositions()
    assert table[aten.index.Tensor](x, [rows, None, cols]) is NotImplemented  # apart
    assert table[aten.index.Tensor](x, [x[:, 0, 0] > 0]) is NotImplemented  # a mask
    assert table[aten.index_put.default](x, [rows], x[:5], False) is NotImplemented


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.bn2 = torch.nn.BatchNorm2d(8)
        self.bias = torch.nn.Parameter(torch.randn(8, 5))
        self.register_buffer("where", torch.randint(0, 5, (4,)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.relu6(self.bn(self.conv(x)))
        x = torch.nn.functional.hardswish(self.bn2(self.conv2(x)))
        return x.mean((2, 3)) @ self.bias[:, self.where]


def _step(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    model(x).square().mean().backward()
    return [p.grad for p in model.parameters()]


@pytest.mark.slow
@pytest.mark.usefixtures("dynamo_reset")
def test_batchnorm_cnn_trains_in_two_regions_and_warm_from_its_plan(cache_dir):
    torch.manual_seed(0)
    reference, x = SmallCNN().train(), torch.randn(2, 3, 16, 16)
    eager = copy.deepcopy(reference)
    want = _step(eager, x)
    for start in ("cold", "warm"):
        torch._dynamo.reset()
        before = ltc_cache.stats()
        model = copy.deepcopy(reference)
        got = _step(torch.compile(model, backend=fresh_backend()), x)
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
        for b, w in zip(model.buffers(), eager.buffers(), strict=True):
            torch.testing.assert_close(b, w, rtol=1e-6, atol=1e-7)  # running statistics
        stats = {k: v - before.get(k, 0) for k, v in ltc_cache.stats().items()}
        # Only the buffers' writes stay eager (3 per BatchNorm, made one
        # _foreach_copy_: docs/torch/aot-autograd.md#running-statistics-written-in-one-call), in 2
        # regions.
        assert stats["aten_ops"] - stats["ltc_ops"] == 1, stats
        regions = stats["hits"] + stats["misses"] - stats.get("plan_hits", 0)
        assert regions == 2 and stats.get("plan_hits", 0) == (start == "warm"), stats
        assert stats["aot_traces"] == (1 if start == "cold" else 0), stats
        assert stats["traces"] == (2 if start == "cold" else 0), stats
