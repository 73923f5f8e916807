"""Views at a region's edge: a view that only ops outside its region read is
left to the parent graph, so the region returns the tensor it looks at
instead of a copy (LTC lowers views to copies, docs/torch/ltc.md#views-are-lowered-to-copies)."""

from __future__ import annotations

import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx

from ltc_cache import CacheConfig, GraphCache, LtcBackend
from ltc_cache.compile_backend.partition import partition
from ltc_cache.compile_backend.support import OpSupport
from ltc_cache.entries.entry import decode

aten = torch.ops.aten
VIEWS = {aten.view.default, aten.transpose.int, aten.permute.default, aten.unsqueeze.default}


def heads(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A product split into heads by views; ``sign`` (which LTC does not
    lower) reads the heads, as the fused attention op reads query, key and
    value. The second output is read inside the region, by ``tanh``."""
    h = torch.mm(x, w)  # 128 x 128: as many elements as the smallest view left out
    split = h.view(2, 64, 2, 64).transpose(1, 2)
    return torch.sign(split.permute(0, 1, 3, 2)), torch.tanh(h.t()) + 1


def partitioned(fn, *args) -> tuple[fx.GraphModule, fx.GraphModule]:
    gm = make_fx(fn)(*args)
    parted = partition(gm, OpSupport())
    assert len(parted.regions) == 1
    return parted.module, parted.module.get_submodule(parted.regions[0])


def view_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in VIEWS]


def test_views_only_the_parent_reads_leave_the_region():
    x, w = torch.randn(128, 128), torch.randn(128, 128)
    parent, region = partitioned(heads, x, w)
    # view, transpose and permute run in the parent, on the region's output;
    # the transpose tanh reads stays inside.
    assert sorted(str(n.target) for n in view_nodes(parent)) == [
        "aten.permute.default", "aten.transpose.int", "aten.view.default"]
    assert not view_nodes(region)
    assert any(n.target is aten.t.default for n in region.graph.nodes)
    # The region returns the product itself, which the parent views.
    region_outputs = region.graph.output_node().args[0]
    assert any(getattr(n, "target", None) is aten.mm.default for n in region_outputs)
    torch.testing.assert_close(parent(x, w), heads(x, w), atol=0, rtol=0)


def test_a_chain_of_views_read_inside_stays():
    def inside(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        v = torch.mm(x, w).view(2, 64, 128).transpose(1, 2)
        return torch.sign(torch.exp(v))  # exp, inside, reads the views

    x, w = torch.randn(128, 128), torch.randn(128, 128)
    parent, region = partitioned(inside, x, w)
    assert not view_nodes(parent)
    assert {n.target for n in view_nodes(region)} == {aten.view.default, aten.transpose.int}
    torch.testing.assert_close(parent(x, w), inside(x, w), atol=0, rtol=0)


def test_views_the_graph_returns_stay_in_the_region():
    """A backward returns weight gradients through ``t``: as views they made
    the optimizer's step slower, so the region keeps returning copies."""
    def returned(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.mm(x, w)
        return torch.sign(h), h.t()

    x, w = torch.randn(128, 128), torch.randn(128, 128)
    parent, region = partitioned(returned, x, w)
    assert not any(n.target is aten.t.default for n in parent.graph.nodes)
    assert any(n.target is aten.t.default for n in region.graph.nodes)
    torch.testing.assert_close(parent(x, w), returned(x, w), atol=0, rtol=0)


def test_a_returned_view_of_an_input_is_taken_in_the_parent_and_read_inside_too():
    """A training forward reads ``t`` of a weight for its product and
    returns it for the backward: the region keeps its own ``t`` (a view
    there) and the parent returns a view of the weight, as AOTAutograd
    saves it, not a copy per step."""
    def saved(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        wt = w.t()
        return torch.sign(torch.mm(x, wt)), wt

    x, w = torch.randn(128, 128), torch.randn(128, 128)
    parent, region = partitioned(saved, x, w)
    assert any(n.target is aten.t.default for n in region.graph.nodes)
    returned = parent.graph.output_node().args[0][1]
    assert returned.target is aten.t.default and returned.args[0].op == "placeholder"
    out, wt = parent(x, w)
    assert wt._base is w  # a view of the weight
    torch.testing.assert_close((out, wt), saved(x, w), atol=0, rtol=0)


def test_small_views_stay_in_the_region():
    """Below ``_MIN_VIEW_ELEMENTS`` a copy costs less than a view taken from
    Python in the parent graph."""
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    parent, region = partitioned(heads_small, x, w)
    assert not view_nodes(parent)
    assert {n.target for n in view_nodes(region)} == {aten.view.default, aten.transpose.int}
    torch.testing.assert_close(parent(x, w), heads_small(x, w), atol=0, rtol=0)


def heads_small(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.sign(torch.mm(x, w).view(2, 4, 2, 8).transpose(1, 2))


def test_a_region_of_views_alone_is_still_no_region():
    def only_views(x: torch.Tensor) -> torch.Tensor:
        return torch.sign(x.view(4, 32).t())

    gm = make_fx(only_views)(torch.randn(8, 16))
    assert partition(gm, OpSupport()).regions == ()


class Heads(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(128, 128)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.proj(x).view(2, 64, 4, 32).transpose(1, 2)
        return torch.sign(q) * q.shape[-1]


def test_through_torch_compile_the_region_stores_no_copy_of_the_view(cache_dir, dynamo_reset):
    model = Heads().eval()
    x = torch.randn(2, 64, 128)
    compiled = torch.compile(model, backend=LtcBackend(GraphCache(CacheConfig.from_env()),
                                                       whole_graph=False))
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(compiled(x), model(x), atol=1e-6, rtol=1e-6)
    store = GraphCache(CacheConfig.from_env()).store
    irs = [decode(store.get(key), expected_key=key).ir for key in list(store.keys())
           if len(key) == 64]
    regions = [ir for ir in irs if "aten::addmm" in ir or "aten::linear" in ir]
    assert regions
    for ir in regions:
        assert "transpose" not in ir and "permute" not in ir


def test_a_view_read_inside_and_by_another_region_is_taken_twice():
    """A backward views each activation gradient for its product and the
    weight gradient's product in a later region reads the view too: the
    region keeps its view, and the later region reads a twin taken in the
    parent graph, so the first returns the gradient itself, not a copy."""
    def twice(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.mm(x, w)
        v = g.view(64, 256)
        s = torch.sign(torch.tanh(v))  # the cut between two regions
        return torch.tanh(s) * 2, v

    x, w = torch.randn(128, 128), torch.randn(128, 128)
    gm = make_fx(twice)(x, w)
    parted = partition(gm, OpSupport())
    parent = parted.module
    twins = [n for n in parent.graph.nodes if n.target is aten.reshape.default]
    assert len(twins) == 1 and twins[0].args[0].op == "call_function"  # the region's output
    first = parent.get_submodule(parted.regions[0])
    outputs = first.graph.output_node().args[0]
    assert not any(getattr(n, "target", None) is aten.view.default for n in outputs)
    assert any(n.target is aten.view.default for n in view_nodes(first))
    torch.testing.assert_close(parent(x, w), twice(x, w), atol=0, rtol=0)


def tails(x, w1, w2, y):
    """Two products that only the output reads (a backward's weight
    gradients), each reading one region's result."""
    h = torch.mm(x, w1)
    o = torch.mm(torch.sign(h), w2)
    o2 = torch.mm(torch.sign(o), w2)
    return o2, torch.mm(y, h), torch.mm(y, o)


def test_a_product_only_the_output_reads_joins_the_region_it_reads():
    """FX's partitioner fused such products into one region after all the
    others, keeping what they read alive until the end; each now runs in
    the region that computes its input."""
    args = [torch.randn(128, 128) for _ in range(4)]
    gm = make_fx(tails)(*args)
    parted = partition(gm, OpSupport())
    assert [parted.region_ops[r] for r in parted.regions] == [2, 2, 1]
    for name in parted.regions[:2]:  # each computes a result and the tail reading it
        region = parted.module.get_submodule(name)
        products = [n for n in region.graph.nodes if n.target is aten.mm.default]
        assert len(products) == 2 and products[0] in products[1].all_input_nodes
    torch.testing.assert_close(parted.module(*args), tails(*args), atol=0, rtol=0)


def done_early(g, a, x, w):
    """A backward's shape: a region is done with its two large inputs
    (1 MiB each) at once, then makes large values of its own from small ones."""
    s = (g * a).sum(0, keepdim=True)
    h = torch.relu(torch.mm(x, w))
    return ((torch.tanh(h) * h) + s).sum(1)


def test_a_backwards_region_is_cut_where_its_inputs_die():
    """A region's caller holds its inputs until it returns
    (docs/torch/aot-autograd.md#region-holds-inputs-until-it-returns): cut after their last reader,
    a backward's region lets them go before its own large values are made."""
    args = [torch.randn(512, 512), torch.randn(512, 512), torch.randn(512, 8),
            torch.randn(8, 512)]
    assert len(partition(make_fx(done_early)(*args), OpSupport()).regions) == 1
    # A backward that recomputes nothing is not cut
    # (docs/torch/aot-autograd.md#backward-cuts-pay-only-when-recomputing).
    assert len(partition(make_fx(done_early)(*args), OpSupport(), boxed=True).regions) == 1
    parted = partition(make_fx(done_early)(*args), OpSupport(), boxed=True, recomputes=True)
    large = list(parted.module.graph.find_nodes(op="placeholder"))[:2]
    readers = [[r for r in parted.regions if any(user.target == r for user in node.users)]
               for node in large]
    # The first region reads them; the region that makes h and tanh(h) does not.
    assert readers == [[parted.regions[0]]] * 2 and len(parted.regions) >= 2, parted
    torch.testing.assert_close(parted.module(*args), done_early(*args), atol=0, rtol=0)


def done_early_in_a_tuple(g, x, w):
    """``done_early`` whose large input dies in an op of two outputs."""
    s = torch.max(g, 0, keepdim=True).values
    h = torch.relu(torch.mm(x, w))
    return ((torch.tanh(h) * h) + s).sum(1)


def test_no_cut_parts_an_op_of_several_outputs_from_its_getitems():
    """A cut right after ``max.dim`` would free its 4 MiB input, but the
    first region would return the op's tuple, which LTC refuses (the region
    ran eagerly: docs/torch/aot-autograd.md#backward-cuts-pay-only-when-recomputing): every region
    returns tensors."""
    args = [torch.randn(2048, 512), torch.randn(512, 8), torch.randn(8, 512)]
    parted = partition(make_fx(done_early_in_a_tuple)(*args), OpSupport(), boxed=True,
                       recomputes=True)
    for name in parted.regions:
        output = next(iter(parted.module.get_submodule(name).graph.find_nodes(op="output")))
        for value in output.args[0]:
            assert isinstance(value.meta.get("val"), torch.Tensor), (name, value)
    torch.testing.assert_close(parted.module(*args), done_early_in_a_tuple(*args),
                               atol=0, rtol=0)
