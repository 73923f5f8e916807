"""A program's graph cut at DDP's gradient buckets (ltc_cache.program.ddp_buckets):
where the cuts fall, and that the cut graph computes what the whole one did."""

from __future__ import annotations

import types

import pytest
import torch
from torch import fx

from ltc_cache.program import ddp_buckets


def three_layers(x, w1, w2, w3):
    halves = torch.chunk(torch.relu(x @ w1), 2, dim=1)
    # The second half is taken out of the tuple after w2's layer: a cut
    # between w2's and w3's would fall between the tuple and its element.
    first = halves[0] @ w2
    return (first + halves[1] @ w3).sum(),


LAYER = 4 * 8 * 4  # the bytes of w2 and of w3 (w1 is twice as large)


def graph_and_args() -> tuple[fx.GraphModule, list[torch.Tensor]]:
    gm = fx.symbolic_trace(three_layers)
    torch.manual_seed(0)
    weights = [torch.nn.Parameter(torch.randn(*shape)) for shape in ((8, 8), (4, 8), (4, 8))]
    return gm, [torch.randn(4, 8), *weights]


def fake_ddp(cap: int, first: int | None = None) -> types.SimpleNamespace:
    """What the cut reads of a DDP: its caps, in bytes."""
    config = types.SimpleNamespace(first_bucket_bytes_cap=cap if first is None else first)
    return types.SimpleNamespace(bucket_bytes_cap=cap, _bucket_config=config)


def cut(ddp, gm, args, pieces: list[fx.GraphModule]) -> fx.GraphModule | None:
    def piece(graph: fx.GraphModule, name: str):
        pieces.append(graph)
        return graph

    return ddp_buckets.cut_at_buckets(ddp, gm, args, "three", piece)


def weights_of(piece: fx.GraphModule, args) -> set[str]:
    return {n.name for n in piece.graph.find_nodes(op="placeholder") if n.name.startswith("w")}


def test_each_bucket_of_weights_is_a_piece_from_the_graph_end():
    gm, args = graph_and_args()
    pieces: list[fx.GraphModule] = []
    assert cut(fake_ddp(cap=LAYER), gm, args, pieces) is not None
    # From the end: w3 fills the first bucket, w2 the next, w1 the last.
    assert [weights_of(p, args) for p in pieces] == [{"w1"}, {"w2"}, {"w3"}]


def test_a_small_first_bucket_then_larger_ones():
    gm, args = graph_and_args()
    pieces: list[fx.GraphModule] = []
    assert cut(fake_ddp(cap=4 * LAYER, first=LAYER), gm, args, pieces) is not None
    assert [weights_of(p, args) for p in pieces] == [{"w1", "w2"}, {"w3"}]


def test_one_bucket_for_every_weight_leaves_the_graph_whole():
    gm, args = graph_and_args()
    assert cut(fake_ddp(cap=2**20), gm, args, []) is None
    with torch.no_grad():  # nothing to reduce
        assert cut(fake_ddp(cap=1), gm, args, []) is None


def test_a_tuple_is_not_passed_between_pieces():
    gm, args = graph_and_args()
    pieces: list[fx.GraphModule] = []
    cut(fake_ddp(cap=LAYER), gm, args, pieces)
    assert len(pieces) == 3
    for piece in pieces:
        inputs = [n.name for n in piece.graph.find_nodes(op="placeholder")]
        assert "chunk" not in inputs, piece.code


def test_the_cut_graph_computes_the_whole_ones_values_and_gradients():
    gm, args = graph_and_args()
    want = gm(*args)[0]
    want.backward()
    expected = [w.grad.clone() for w in args[1:]]
    for w in args[1:]:
        w.grad = None
    pieces: list[fx.GraphModule] = []
    got = cut(fake_ddp(cap=1), gm, args, pieces)(*args)[0]
    got.backward()
    assert len(pieces) == 3
    assert torch.equal(got, want)
    for w, grad in zip(args[1:], expected, strict=True):
        assert torch.equal(w.grad, grad)


def test_the_cut_follows_ddp_and_dynamos_switch(monkeypatch):
    assert ddp_buckets.running_data_parallel() is None  # no DDP forward is running
    ddp = torch.nn.parallel.DistributedDataParallel
    monkeypatch.setattr(ddp, "_active_ddp_module", object())
    assert ddp_buckets.running_data_parallel() is ddp._active_ddp_module
    with torch._dynamo.config.patch(optimize_ddp=False):
        assert ddp_buckets.running_data_parallel() is None


@pytest.mark.parametrize("name", ["_bucket_config", "bucket_bytes_cap", "_active_ddp_module"])
def test_the_ddp_attributes_the_cut_reads_are_torchs(name):
    """Pinned: DDP's caps and its running module, as this torch names them."""
    ddp = torch.nn.parallel.DistributedDataParallel
    if name == "_active_ddp_module":
        assert hasattr(ddp, name) and hasattr(ddp, "_get_active_ddp_module")
        return
    import inspect

    assert f"self.{name} =" in inspect.getsource(ddp.__init__)


def tied(x, w1, w2):
    """w1 is used first and last, as a tied embedding and head are."""
    return ((torch.relu(x @ w1) @ w2) @ w1.t()).sum(),


def test_a_weight_used_twice_counts_where_its_gradient_is_whole():
    """The reducer's buckets fill in the order gradients become whole: a
    tied weight's at its first use (the graph's start), not its last."""
    gm = fx.symbolic_trace(tied)
    weights = [torch.nn.Parameter(torch.randn(8, 8)) for _ in range(2)]
    pieces: list[fx.GraphModule] = []
    assert cut(fake_ddp(cap=8 * 8 * 4), gm, [torch.randn(4, 8), *weights], pieces) is not None
    # From the end: the head adds nothing (w1 is not whole there), w2 fills
    # the first bucket; the rest, from w1's first use, is the second piece.
    assert [weights_of(p, None) for p in pieces] == [{"w1"}, {"w1", "w2"}]


def test_a_graph_that_cannot_be_cut_is_compiled_whole(monkeypatch, caplog):
    gm, args = graph_and_args()

    def broken(*args, **kwargs):
        raise RuntimeError("split_module changed")

    monkeypatch.setattr("torch.fx.passes.split_module.split_module", broken)
    assert cut(fake_ddp(cap=1), gm, args, []) is None
    assert "not cut at DDP's buckets (RuntimeError: split_module changed)" in caplog.text


class Checkpointed(torch.nn.Module):
    """Three blocks, each run under non-reentrant checkpointing."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))

    def forward(self, x):
        for block in self.blocks:
            x = torch.utils.checkpoint.checkpoint(lambda h, b=block: torch.relu(b(h)), x,
                                                  use_reentrant=False)
        return (x.sum(),)


def test_a_dynamo_graph_of_checkpointed_blocks_is_cut_and_computes_the_same():
    """As a program's graph is: Dynamo's, a higher-order op a block, the
    weights its inputs (called with the parameters themselves)."""
    torch.manual_seed(0)
    net, x = Checkpointed(), torch.randn(4, 8)
    seen: dict[str, object] = {}

    def backend(gm, example_inputs):
        def first_call(*args):
            seen["gm"], seen["args"] = gm, args
            return gm(*args)
        return first_call

    want = torch.compile(net, backend=backend, fullgraph=True)(x)[0]
    want.backward()
    expected = [p.grad.clone() for p in net.parameters()]
    net.zero_grad(set_to_none=True)
    gm, args = seen["gm"], seen["args"]
    assert any(isinstance(n.target, torch._ops.HigherOrderOperator) for n in gm.graph.nodes)
    pieces: list[fx.GraphModule] = []
    got = cut(fake_ddp(cap=8 * 9 * 4), gm, args, pieces)(*args)[0]
    got.backward()
    assert len(pieces) == 3
    assert torch.equal(got, want)
    for p, grad in zip(net.parameters(), expected, strict=True):
        assert torch.equal(p.grad, grad)


def test_arguments_that_do_not_fit_the_graph_leave_it_whole(caplog):
    gm, args = graph_and_args()
    assert cut(fake_ddp(cap=1), gm, args[:2], []) is None
    assert "not cut at DDP's buckets (ValueError" in caplog.text
