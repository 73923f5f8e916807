"""Entries to and from bytes: what the body of an entry means.

The envelope around the body (format, schema, checksum, signature) and the
size bound are ``wire.py``'s, which needs no torch; this module adds what
does: tensors and the input layout. Never pickle: an entry is data a new
process can check before it trusts it.
"""

from __future__ import annotations

import ctypes
import functools
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import torch

from ..errors import EntryError
from .kinds import KINDS, EntryKind
from .layout import INPUT_KINDS, OUTPUT_KINDS, Source, Update
from .wire import pack_envelope, read_envelope, unpack

__all__ = ["Entry", "check_layout", "decode", "encode", "input_specs", "source_to_wire",
           "tensor_from_wire", "tensor_to_wire"]


@dataclass(frozen=True)
class Entry:
    """What a new process needs to rebuild a compiled graph, and what
    ``ltc-cache ls`` shows about it.

    ``kind`` says what it holds (``wire.KINDS``): a ``graph`` has its IR and
    layout; the other kinds have none, and what they hold is ``payload``
    (a negative entry's ``reason``, a plan's graphs, a program's parts)."""

    key: str
    ir: str
    inputs: tuple[Source, ...]
    outputs: tuple[Source, ...]
    updates: tuple[Update, ...]
    # graph_name, node_count, created, torch_version, graph_hash, key_parts …
    meta: Mapping[str, Any] = field(default_factory=dict)
    kind: str = EntryKind.GRAPH
    payload: Mapping[str, Any] = field(default_factory=dict)

    @property
    def graph_name(self) -> str:
        return str(self.meta.get("graph_name", "?"))

    @property
    def created(self) -> float:
        return float(self.meta.get("created", 0.0))

    @functools.cached_property
    def sources(self) -> tuple[Source, ...]:
        """Every source the entry names: inputs, outputs, update targets."""
        return (*self.inputs, *self.outputs, *(u.target for u in self.updates))

    @functools.cached_property  # read by the entry check and the binding of a hit
    def attr_paths(self) -> frozenset[str]:
        """The module tensors a replay binds."""
        return frozenset(s.ref for s in self.sources if s.kind == "attr")


def new_meta(*, graph_name: str, node_count: int, graph_hash: str,
             key_parts: Mapping[str, str]) -> dict[str, Any]:
    return {
        "graph_name": graph_name,
        "node_count": node_count,
        "graph_hash": graph_hash,
        "created": time.time(),
        "torch_version": torch.__version__,
        "key_parts": dict(key_parts),
    }


def input_specs(inputs: Sequence[Source], args: Sequence[Any],
                tensors: Mapping[str, torch.Tensor]) -> list[list[Any]] | None:
    """Each graph input's dtype, sizes and strides, as traced (``args``:
    the call's, ``tensors``: the module's); None where one is not a plain
    CPU tensor of static sizes."""
    specs = []
    for s in inputs:
        t = args[s.ref] if s.kind == "arg" else tensors.get(s.ref) if s.kind == "attr" else s.ref
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.is_sparse:
            return None
        try:
            specs.append([str(t.dtype).removeprefix("torch."), [int(n) for n in t.shape],
                          [int(n) for n in t.stride()]])
        except (TypeError, RuntimeError):  # symbolic sizes
            return None
    return specs


def tensor_to_wire(t: torch.Tensor) -> dict[str, Any]:
    """A tensor's dtype, shape and bytes, as msgpack takes them."""
    t = t.detach().to("cpu").contiguous()
    data = ctypes.string_at(t.data_ptr(), t.nbytes) if t.nbytes else b""
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "data": data}


def tensor_from_wire(obj: Any) -> torch.Tensor:
    """The tensor :func:`tensor_to_wire` wrote; raises EntryError for
    anything else."""
    dtype = getattr(torch, obj["dtype"], None)
    if not isinstance(dtype, torch.dtype):
        raise EntryError(f"unknown dtype {obj['dtype']!r}")
    shape = obj["shape"]
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise EntryError(f"tensor shape {shape!r} is not a list of sizes")
    if not isinstance(obj["data"], bytes):
        raise EntryError("tensor data is not bytes")
    # The shape must account for the data exactly: a large shape over empty
    # data would otherwise allocate whatever the entry asks for.
    if math.prod(shape) * dtype.itemsize != len(obj["data"]):
        raise EntryError(f"tensor of shape {shape} and {dtype} does not fit "
                         f"{len(obj['data'])} bytes of data")
    # A tensor of torch's own allocator, which aligns to 64 bytes, not one
    # over Python's bytes (16): MKL's kernels may round differently on data
    # aligned differently, and a warm process must compute what the cold
    # one did, where the same constant was torch's.
    tensor = torch.empty(shape, dtype=dtype)
    ctypes.memmove(tensor.data_ptr(), obj["data"], len(obj["data"]))
    return tensor


def source_to_wire(s: Source) -> list[Any]:
    """A graph input's or output's stored form: ``[kind, ref]``, a
    constant's ref its tensor's dtype, shape and bytes."""
    return [s.kind, tensor_to_wire(s.ref) if s.kind == "const" else s.ref]


def _source_from_wire(obj: Any, kinds: frozenset[str]) -> Source:
    kind, ref = obj
    if kind not in kinds:
        raise EntryError(f"unknown source kind {kind!r}")
    if kind == "const":
        return Source(kind, tensor_from_wire(ref))
    if kind in ("arg", "out") and not isinstance(ref, int):
        raise EntryError(f"{kind} index is {type(ref).__name__}, not int")
    if kind == "attr" and not isinstance(ref, str):
        raise EntryError("attribute path is not a string")
    return Source(kind, ref)


def encode(entry: Entry, *, secret: bytes | None = None) -> bytes:
    """Entry -> bytes; with ``secret``, signed with HMAC-SHA256."""
    body = msgpack.packb({
        "key": entry.key,
        "ir": entry.ir,
        "inputs": [source_to_wire(s) for s in entry.inputs],
        "outputs": [source_to_wire(s) for s in entry.outputs],
        "updates": [[u.output, source_to_wire(u.target)] for u in entry.updates],
        "meta": dict(entry.meta),
        "kind": entry.kind,
        "payload": dict(entry.payload),
    }, use_bin_type=True)
    return pack_envelope(body, secret=secret)


def decode(data: bytes, expected_key: str | None = None, *,
           secret: bytes | None = None) -> Entry:
    """Bytes -> Entry; raises EntryError for anything but a good entry
    (of ``expected_key``, where given; signed with ``secret``, where given)."""
    body = read_envelope(data, secret=secret)["body"]
    try:
        obj = unpack(body)
        entry = Entry(
            key=obj["key"],
            ir=obj["ir"],
            inputs=tuple(_source_from_wire(s, INPUT_KINDS) for s in obj["inputs"]),
            outputs=tuple(_source_from_wire(s, OUTPUT_KINDS) for s in obj["outputs"]),
            updates=tuple(Update(int(o), _source_from_wire(t, frozenset({"arg", "attr"})))
                          for o, t in obj["updates"]),
            meta=obj["meta"],
            kind=obj["kind"],
            payload=obj["payload"],
        )
    except EntryError:
        raise
    except Exception as exc:  # the body has the wrong shape
        raise EntryError(f"malformed body ({type(exc).__name__}: {exc})") from None
    if not isinstance(entry.key, str) or not isinstance(entry.ir, str) \
            or not isinstance(entry.meta, dict) or not isinstance(entry.payload, dict):
        raise EntryError("malformed body (field types)")
    if entry.kind not in KINDS:
        raise EntryError(f"unknown entry kind {entry.kind!r}")
    if expected_key is not None and entry.key != expected_key:
        raise EntryError(f"stored under {expected_key[:12]} but is {entry.key[:12]}")
    return entry


def check_layout(entry: Entry, *, graph_inputs: int, graph_outputs: int, num_args: int) -> None:
    """Raise EntryError where ``entry``'s layout does not fit the graph its
    IR parsed to (``graph_inputs`` parameters, ``graph_outputs`` results)
    and a call with ``num_args`` arguments. A checksum only proves the bytes
    are the ones written; this catches an entry written wrong before its
    replay fails inside the user's model."""
    if len(entry.inputs) != graph_inputs:
        raise EntryError(f"{len(entry.inputs)} inputs laid out for a graph of {graph_inputs}")
    bounds = {"arg": num_args, "out": graph_outputs}
    for s in entry.sources:
        if s.kind in bounds and not (type(s.ref) is int and 0 <= s.ref < bounds[s.kind]):
            raise EntryError(f"{s.kind} index {s.ref!r} out of range")
    for u in entry.updates:
        if not 0 <= u.output < graph_outputs:
            raise EntryError(f"update from output {u.output} out of range")
