"""Big graphs and big entries round-trip through the disk tier."""

from __future__ import annotations

import pytest
import torch
from torch import fx

import ltc_cache
from ltc_cache import CacheConfig, GraphCache
from ltc_cache.entries.entry import Entry, decode, encode, new_meta
from ltc_cache.entries.layout import Source
from ltc_cache.graph.replay import CompiledGraph, build_function
from ltc_cache.store import DiskStore

FX_NODES = 10_000


def _chain(nodes: int) -> fx.GraphModule:
    """An FX graph of ``nodes`` nodes: x, then adds and multiplies by
    different constants (nothing LTC could fold away), then the output."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    for i in range((nodes - 2) // 2):
        x = graph.call_function(torch.add, (x, 1.0 + i % 7))
        x = graph.call_function(torch.mul, (x, 0.5 + i % 3 * 0.25))
    graph.output((x,))
    return fx.GraphModule(torch.nn.Module(), graph)


@pytest.mark.slow  # a 10,000-node graph traced and parsed
def test_a_graph_of_ten_thousand_nodes(tmp_path):
    gm = _chain(FX_NODES)
    assert len(gm.graph.nodes) == FX_NODES
    x = torch.randn(4, 3)
    expected = gm(x)[0]
    cold = GraphCache(CacheConfig(directory=tmp_path)).extract_compiled_graph(gm, [x])
    torch.testing.assert_close(cold(x)[0], expected)

    before = ltc_cache.stats()
    warm = GraphCache(CacheConfig(directory=tmp_path)).extract_compiled_graph(gm, [x])
    after = ltc_cache.stats()
    assert (after["hits"] - before["hits"], after["traces"] - before["traces"]) == (1, 0)
    # One IR node or more per add and multiply, whatever the stored IR adds.
    assert warm.entry.meta["node_count"] >= FX_NODES - 2
    y = torch.randn(4, 3)
    torch.testing.assert_close(warm(y)[0], gm(y)[0])


def test_an_entry_of_fifty_megabytes(tmp_path):
    """A stored constant of 50 MB (13.1M float32): encoded, stored as a value
    file, read by another store object, decoded, replayed."""
    constant = torch.randn(50 * 2**20 // 4)
    ir = ("graph(%x : Float(13107200, strides=[1], requires_grad=0, device=cpu),\n"
          "      %c : Float(13107200, strides=[1], requires_grad=0, device=cpu)):\n"
          "  %one : int = prim::Constant[value=1]()\n"
          "  %y : Float(13107200, strides=[1], requires_grad=0, device=cpu) = "
          "aten::add(%x, %c, %one)\n"
          "  return (%y)\n")
    key = "5" * 64
    meta = new_meta(graph_name="fifty", node_count=1, graph_hash="", key_parts={})
    entry = Entry(key, ir, (Source("arg", 0), Source("const", constant)),
                  (Source("out", 0),), (), meta)
    data = encode(entry, secret=b"signed too")
    assert len(data) > 50 * 2**20

    DiskStore(tmp_path).put(key, data)
    read = DiskStore(tmp_path).get(key)
    assert read == data
    loaded = decode(read, expected_key=key, secret=b"signed too")
    assert torch.equal(loaded.inputs[1].ref, constant)
    compiled = CompiledGraph(loaded, build_function(loaded.ir), torch.nn.Module())
    x = torch.randn(constant.numel())
    torch.testing.assert_close(compiled(x)[0], x + constant)
