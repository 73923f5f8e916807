"""``as_strided`` over a view laid out otherwise than contiguously (the
sliding-window chunks of Longformer's attention): eager's strides address
the storage, LTC's the elements in logical order, so such a read runs
eagerly, over its input as eager lays it out (docs/torch/ltc.md#ltc-as-strided-strides-elements)."""

from __future__ import annotations

import pytest
import torch

from ltc_cache import CacheConfig, GraphCache, LtcBackend

pytestmark = pytest.mark.usefixtures("dynamo_reset")


class Chunks(torch.nn.Module):
    """Longformer's ``_chunk``: overlapping windows of a transposed view."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (seq 8, batch 4, 16)
        h = self.proj(x).transpose(0, 1)  # (4, 8, 16), not contiguous
        h = h.view(4, 2, 4, 16)
        size, stride = list(h.size()), list(h.stride())
        size[1], stride[1] = 3, stride[1] // 2
        windows = h.as_strided(size=size, stride=stride)
        return torch.einsum("bcxd,bcyd->bcxy", windows, windows).softmax(-1)


@pytest.mark.parametrize("how", ["inference, whole", "inference, partitioned", "training"])
def test_as_strided_of_a_transposed_view_computes_what_eager_does(cache_dir, how):
    """Lowered whole, LTC's own view tracking strides the base; in an aten
    graph's region, the view chain is copies and the strides read those."""
    torch.manual_seed(0)
    model, eager = Chunks(), Chunks()
    eager.load_state_dict(model.state_dict())
    x = torch.randn(8, 4, 16)
    training = how == "training"
    backend = LtcBackend(GraphCache(CacheConfig.from_env()), whole_graph=how.endswith("whole"))
    compiled = torch.compile(model, backend=backend)
    with torch.set_grad_enabled(training):
        got, want = compiled(x), eager(x)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    if training:
        got.pow(2).sum().backward()
        want.pow(2).sum().backward()
        torch.testing.assert_close(model.proj.weight.grad, eager.proj.weight.grad,
                                   atol=1e-6, rtol=1e-5)


def test_as_strided_of_its_contiguous_input_stays_in_ltc():
    """The rule leaves in LTC what LTC computes as eager does."""
    from torch import fx

    from ltc_cache.compile_backend.support import strided_otherwise

    def node_of(base: torch.Tensor, *args: object) -> fx.Node:
        graph = fx.Graph()
        x = graph.placeholder("x")
        x.meta["val"] = base
        return graph.call_function(torch.ops.aten.as_strided.default, (x, *args))

    plain = torch.empty(4, 8, 16)
    assert not strided_otherwise(node_of(plain, [4, 3, 4, 16], [128, 32, 16, 1]))
    assert strided_otherwise(node_of(plain.transpose(0, 1), [8, 4, 16], [64, 16, 1]))
    assert strided_otherwise(node_of(plain, [4, 3, 4, 16], [128, 32, 16, 1], 5))  # offset
    assert strided_otherwise(node_of(plain[:2], [8, 16], [64, 1]))  # past its end
