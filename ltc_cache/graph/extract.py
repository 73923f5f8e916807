"""Lazy-trace an FX graph once and describe what replaying it needs.

This keeps the semantics of ``torch._lazy.extract_compiled_graph`` (read it
in the installed torch) and generalises them: module tensors are traced as
inputs with known ids, so they can be bound live later; in-place updates of
arguments and buffers are found by the ids they change; ``None`` and plain
Python outputs pass through.
"""

from __future__ import annotations

import copy
import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from ..entries.layout import Source, Update
from ..errors import GraphNotExtractable, LtcUnavailable
from ..fx_ops import reparametrized
from . import lazy_bindings as ltc
from .graph_keys import module_tensors

__all__ = ["Extraction", "init_lazy_backend", "normalize_ir", "trace"]

logger = logging.getLogger("ltc_cache.extract")

# LTC tags each node with the Python line that made it; the text would make
# the same graph differ by checkout path, so it is not stored.
_STRING = r'"(?:[^"\\]|\\.)*"'
_SOURCE_ANNOTATION = re.compile(rf"\[source={_STRING}\]|, source={_STRING}")
# LTC names the fields of tuple results (``NamedTuple(values : Tensor,
# indices : Tensor)`` for ``max.dim``), which parse_ir cannot read back; the
# replay only indexes them, so a plain tuple type serves.
_NAMED_TUPLE = re.compile(r"NamedTuple\(([^()]*)\)")
_PLAIN_OUTPUTS = (bool, int, float, str)


@dataclass(frozen=True)
class Extraction:
    """A traced graph, in the terms a new process needs to replay it."""

    ir: str  # TorchScript graph text; "" when nothing is computed
    inputs: tuple[Source, ...]  # one per graph parameter, in order
    outputs: tuple[Source, ...]  # one per value the model returns
    updates: tuple[Update, ...]  # in-place updates to copy back
    graph_hash: str  # LTC's hash of the computation, for listing


def normalize_ir(ir: str) -> str:
    """The IR as stored: without source annotations, with tuple types
    parse_ir reads."""
    ir = _SOURCE_ANNOTATION.sub("", ir)
    return _NAMED_TUPLE.sub(lambda m: "(" + ", ".join(
        field.split(" : ", 1)[-1].strip() for field in m.group(1).split(",")) + ")", ir)


def _shadow(module: torch.nn.Module, made: dict[int, torch.nn.Module]) -> torch.nn.Module:
    """A copy of ``module``'s tree whose modules hold the same tensors in
    dictionaries of their own (a module met twice is shadowed once)."""
    found = made.get(id(module))
    if found is None:
        found = made[id(module)] = object.__new__(type(module))
        found.__dict__.update(module.__dict__)
        found._parameters = dict(module._parameters)
        found._buffers = dict(module._buffers)
        found._modules = {name: None if child is None else _shadow(child, made)
                          for name, child in module._modules.items()}
    return found


def trace(model: fx.GraphModule, example_inputs: Sequence[Any]) -> Extraction:
    """Trace ``model`` on the lazy device and sync it, as the original does.

    Raises GraphNotExtractable naming the ops that fell back to eager: a
    graph with fallbacks has holes LTC filled with eager values and cannot
    be replayed.
    """
    init_lazy_backend()
    # A new GraphModule over a copy of the graph shares the weights, so
    # forcing factory calls onto the lazy device copies no tensor. Its
    # modules are shadows of the model's: the trace swaps lazy tensors in
    # for their weights, and the model itself, which other threads may be
    # reading or running meanwhile, must keep its own.
    lazy_model = fx.GraphModule(_shadow(model, {}), copy.deepcopy(model.graph))
    ltc.force_lazy_device(lazy_model)

    # Detached copies: the trace records the forward computation only.
    lazy_args = [_to_lazy(a) if isinstance(a, torch.Tensor) else a for a in example_inputs]
    lazy_state = {name: _to_lazy(t) for name, t in module_tensors(model).items()}
    arg_ids = {ltc.tensor_id(a): i for i, a in enumerate(lazy_args)
               if isinstance(a, torch.Tensor)}
    attr_ids = {ltc.tensor_id(t): name for name, t in lazy_state.items()}

    ltc.reset_metrics()
    # functional_call's reparametrisation, but calling forward directly:
    # GraphModule.__call__ prints a full traceback to stderr for any
    # exception, and a graph LTC cannot trace is an expected outcome here.
    with reparametrized(lazy_model, lazy_state):
        lazy_out = lazy_model.forward(*lazy_args)
    # Lazy tensors are functionalized: a write through a view
    # (``x.t().mul_(2)``) is in the graph, and in the ids that find updated
    # inputs, only once the tensors are synced.
    ltc.sync_functional([*lazy_args, *lazy_state.values(),
                 *(lazy_out if isinstance(lazy_out, (tuple, list)) else (lazy_out,))])
    fallback_ops = ltc.fallback_ops()
    ltc.reset_metrics()
    if fallback_ops:
        raise GraphNotExtractable(
            f"Fail to extract the compiled graph because of fallback: {','.join(fallback_ops)}"
        )
    if not isinstance(lazy_out, (tuple, list)):
        lazy_out = (lazy_out,)

    # In LTC an in-place op gives the tensor a new id.
    graph_tensors: list[torch.Tensor] = []
    slot_of: dict[int, int] = {}

    def slot(t: torch.Tensor) -> int:
        if id(t) not in slot_of:
            slot_of[id(t)] = len(graph_tensors)
            graph_tensors.append(t)
        return slot_of[id(t)]

    updates = []
    known: dict[int, Source] = {}  # id() of an input lazy tensor -> its source
    for tid, i in arg_ids.items():
        known[id(lazy_args[i])] = Source("arg", i)
        if ltc.tensor_id(lazy_args[i]) != tid:
            updates.append(Update(slot(lazy_args[i]), Source("arg", i)))
    for tid, name in attr_ids.items():
        known[id(lazy_state[name])] = Source("attr", name)
        if ltc.tensor_id(lazy_state[name]) != tid:
            updates.append(Update(slot(lazy_state[name]), Source("attr", name)))

    outputs = tuple(_output_source(o, known, slot) for o in lazy_out)

    if not graph_tensors:
        return Extraction("", (), outputs, tuple(updates), "")
    ir = ltc.dump_ir(graph_tensors)
    if _returns(ir) != len(graph_tensors):
        graph_tensors = _with_ir_values(graph_tensors)
        ir = ltc.dump_ir(graph_tensors)
        if _returns(ir) != len(graph_tensors):
            raise GraphNotExtractable(f"LTC's graph returns {_returns(ir)} of the "
                               f"{len(graph_tensors)} values traced")
    ir = normalize_ir(ir)
    input_ids, input_values = ltc.ts_device_data(graph_tensors)
    inputs = tuple(_input_source(tid, value, arg_ids, attr_ids)
                   for tid, value in zip(input_ids, input_values, strict=True))
    graph_hash = ltc.graph_hash(graph_tensors).hex()
    # Syncing makes LTC compile and run the graph: what it cannot lower
    # fails here, at trace time, rather than in a later process.
    ltc.sync_multi(graph_tensors)
    return Extraction(ir, inputs, outputs, tuple(updates), graph_hash)


def _returns(ir: str) -> int:
    """How many values the dumped TorchScript graph returns."""
    for line in reversed(ir.strip().splitlines()):
        line = line.strip()
        if line.startswith("return"):
            inner = line[len("return"):].strip().strip("()")
            return len([v for v in inner.split(",") if v.strip()])
    return 0


def _with_ir_values(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """``tensors`` with each one that holds only data (no IR node: a tensor
    made from data inside the graph, such as ``x.new_tensor([1., 2.])``)
    replaced by a clone of it. LTC's dump skips such tensors, both among
    the graph's results and its inputs, so the graph would return fewer
    values than were traced and take other parameters than were listed;
    a clone is an IR node over the data, as every other result is."""
    return [t.clone() if not ltc.dump_ir([t]) else t for t in tensors]


_init_lock = threading.Lock()


def init_lazy_backend() -> None:
    """Initialise LTC's TorchScript backend once per process, unless someone
    else did: a program may call ``torch._lazy.ts_backend.init()`` itself
    (as LTC's own users do), and a second init raises. A failure here says
    nothing about the graph: it is LtcUnavailable, never a negative entry."""
    with _init_lock:
        if ltc.backend_registered():
            return
        try:
            ltc.init_ts_backend()
        except Exception as exc:
            if ltc.backend_registered():  # another thread or library got there first
                return
            raise LtcUnavailable(f"cannot initialise LTC's TorchScript backend ({exc})") from exc


def _to_lazy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(device="lazy")


def _input_source(tid: int, value: Any, arg_ids: dict[int, int],
                  attr_ids: dict[int, str]) -> Source:
    if tid in arg_ids:
        return Source("arg", arg_ids[tid])
    if tid in attr_ids:
        return Source("attr", attr_ids[tid])
    if not isinstance(value, torch.Tensor):
        raise GraphNotExtractable(f"graph input of type {type(value).__name__} cannot be stored")
    # Scalars the trace captured (``x * 2.5``, ``alpha=1``) arrive as 0-dim
    # tensors; factory results baked in by LTC arrive as data.
    return Source("const", value.detach().to("cpu").clone())


def _output_source(value: Any, known: dict[int, Source], slot) -> Source:
    if value is None:
        return Source("none", None)
    if isinstance(value, torch.Tensor):
        if id(value) in known:
            # The model returned one of its inputs: hand back the live tensor
            # (updated in place if it was), as eager would.
            return known[id(value)]
        if value.device.type != "lazy":
            return Source("const", value.detach().clone())
        return Source("out", slot(value))
    if isinstance(value, _PLAIN_OUTPUTS):
        return Source("value", value)
    raise GraphNotExtractable(f"cannot extract a graph that returns {type(value).__name__}")
