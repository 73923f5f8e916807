"""Entries round-trip through msgpack and refuse anything else."""

from __future__ import annotations

import msgpack
import pytest
import torch

from ltc_cache.entries.entry import Entry, EntryError, decode, encode
from ltc_cache.entries.layout import Source, Update

CONSTANTS = [torch.tensor(2.5, dtype=torch.float64), torch.tensor(1),
             torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), torch.empty(0, 4),
             torch.tensor([True, False])]


def sample() -> Entry:
    return Entry(
        key="k" * 64,
        ir="graph(%p0 : Tensor):\n  return (%p0)\n",
        inputs=(Source("arg", 0), Source("attr", "linear.weight"),
                *(Source("const", c) for c in CONSTANTS)),
        outputs=(Source("out", 0), Source("none", None), Source("value", 3), Source("arg", 1)),
        updates=(Update(1, Source("attr", "norm.running_mean")),),
        meta={"graph_name": "G", "node_count": 1},
    )


def test_round_trip():
    entry = sample()
    back = decode(encode(entry), expected_key=entry.key)
    assert back.ir == entry.ir and back.meta == entry.meta
    assert back.outputs == entry.outputs and back.updates == entry.updates
    assert [s.kind for s in back.inputs] == [s.kind for s in entry.inputs]
    for stored, original in zip(back.inputs[2:], CONSTANTS, strict=True):
        assert stored.ref.dtype == original.dtype
        assert torch.equal(stored.ref, original)


def test_decoded_constants_are_torch_tensors_aligned_as_torch_aligns():
    """A constant read back lives in torch's allocator (64-byte aligned), as
    the cold process's did, owns its memory and is writable: kernels whose
    rounding depends on alignment compute the same in a warm process."""
    for numel in (1, 3, 5, 17, 1000, 24_577):
        original = torch.arange(numel, dtype=torch.float32)
        entry = sample()
        entry = Entry(key=entry.key, ir=entry.ir, inputs=(Source("const", original),),
                      outputs=entry.outputs, updates=(), meta=entry.meta)
        back = decode(encode(entry), expected_key=entry.key).inputs[0].ref
        assert torch.equal(back, original)
        assert back.data_ptr() % 64 == 0, (numel, back.data_ptr() % 64)
        back.add_(1)  # writable, and its own copy
        assert back[0].item() == 1.0


def test_every_flipped_byte_is_detected():
    data = encode(sample())
    for i in range(0, len(data), 7):
        corrupt = bytearray(data)
        corrupt[i] ^= 0x55
        with pytest.raises(EntryError):
            decode(bytes(corrupt))


def test_truncation_and_wrong_key_and_wrong_shape():
    data = encode(sample())
    for cut in (0, 1, len(data) // 2, len(data) - 1):
        with pytest.raises(EntryError):
            decode(data[:cut])
    with pytest.raises(EntryError, match="stored under"):
        decode(data, expected_key="x" * 64)
    with pytest.raises(EntryError, match="not an ltc_cache entry"):
        decode(msgpack.packb([1, 2, 3]))


def test_an_entry_says_what_it_is():
    """The kind and its payload are fields of their own, and a kind this
    ltc_cache does not know is refused, not read as a graph."""
    import dataclasses

    plan = dataclasses.replace(sample(), ir="", inputs=(), outputs=(), updates=(), kind="plan",
                               payload={"plan": {"graph": {"nodes": []}}})
    back = decode(encode(plan))
    assert (back.kind, back.payload) == ("plan", plan.payload) and "kind" not in back.meta
    assert decode(encode(sample())).kind == "graph"
    with pytest.raises(EntryError, match="unknown entry kind 'blob'"):
        decode(encode(dataclasses.replace(sample(), kind="blob")))
