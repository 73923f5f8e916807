"""The key of a graph LTC traces: its code, the tensors it holds, its
inputs' layouts, and this process's torch and LTC settings, as named parts
(:mod:`ltc_cache.entries.keys`), so that a miss can be explained.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import fx

from ..entries.keys import CacheKey, hash_lines, key_from_parts
from ..entries.wire import SCHEMA_VERSION
from ..errors import UncacheableGraph
from . import lazy_bindings

__all__ = ["compute_key", "graph_digest", "graph_parts", "key_of", "module_tensors",
           "tensor_signature"]

_SCALARS = (bool, int, float, str, type(None))


def module_tensors(model: fx.GraphModule) -> dict[str, torch.Tensor]:
    """Every tensor the graph can reach by name: parameters, buffers and
    tensor attributes read by ``get_attr`` nodes (AOTAutograd's
    ``_tensor_constant*``). These are bound live at replay, never stored.

    The names and order of ``named_parameters()`` then ``named_buffers()``
    (a module or tensor reachable twice counts once, under its first name),
    in one walk over ``_modules``: the public iterators cost ~2 ms on a
    model of 256 ``Linear`` layers, a tenth of a warm start.
    """
    modules: list[tuple[str, torch.nn.Module]] = []
    seen_modules: set[int] = set()
    stack: list[tuple[str, torch.nn.Module]] = [("", model)]
    while stack:  # pre-order, children in registration order
        prefix, module = stack.pop()
        if id(module) in seen_modules:
            continue
        seen_modules.add(id(module))
        modules.append((prefix, module))
        stack.extend((f"{prefix}{name}.", child) for name, child
                     in reversed(module._modules.items()) if child is not None)
    tensors: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for table in ("_parameters", "_buffers"):
        for prefix, module in modules:
            for name, t in getattr(module, table).items():
                if t is not None and id(t) not in seen:
                    seen.add(id(t))
                    tensors[prefix + name] = t
    for node in model.graph.nodes:
        if node.op == "get_attr" and node.target not in tensors:
            value = _resolve(model, node.target)
            if isinstance(value, torch.Tensor):
                tensors[node.target] = value
    return tensors


def _resolve(model: torch.nn.Module, path: str) -> Any:
    value: Any = model
    for attr in path.split("."):
        value = getattr(value, attr)
    return value


def _submodule(model: torch.nn.Module, path: str) -> torch.nn.Module:
    # Through ``_modules`` directly: ``get_submodule``'s checks cost ~10 us
    # a call, most of the key's time on a graph of a few hundred layers.
    for name in path.split("."):
        model = model._modules[name]
    return model


def tensor_signature(t: torch.Tensor) -> str:
    return (f"{tuple(t.shape)}|{t.stride()}|{t.dtype}|{t.device}"
            f"|grad={t.requires_grad}|{type(t).__name__}")


def _tensor_signatures(tensors: Mapping[str, torch.Tensor]) -> Iterator[str]:
    # Formatting a signature costs more than building its parts; the weights
    # of a model share a few layouts, so each layout is formatted once.
    formatted: dict[tuple[Any, ...], str] = {}
    for name, t in tensors.items():
        layout = (t.shape, t.stride(), t.dtype, t.device, t.requires_grad, type(t))
        text = formatted.get(layout)
        if text is None:
            text = formatted[layout] = tensor_signature(t)
        yield f"{name}:{text}"


def _value_signature(value: Any) -> str:
    """Inputs by layout, Python values by type and value."""
    if isinstance(value, torch.Tensor):
        return "tensor:" + tensor_signature(value)
    if isinstance(value, _SCALARS):
        return f"{type(value).__name__}:{value!r}"
    if isinstance(value, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return f"{type(value).__name__}:{value}"
    if isinstance(value, (tuple, list)):
        inner = ",".join(_value_signature(v) for v in value)
        return f"{type(value).__name__}:[{inner}]"
    raise UncacheableGraph(f"no stable cache key for an argument of type {type(value).__name__}")


def _graph_text(model: fx.GraphModule) -> Iterator[str]:
    # The generated code names every op and constant; what it leaves out is
    # the state of the leaf modules it calls (nn.Dropout's p, nn.LeakyReLU's
    # slope) and the train/eval flags that change what they compute.
    yield model.code
    yield f"training={model.training}"
    for node in model.graph.nodes:
        if node.op == "call_module":
            sub = _submodule(model, node.target)
            yield (f"{node.target}={type(sub).__module__}.{type(sub).__qualname__}"
                   f"({sub.extra_repr()}) training={sub.training}")


def _lazy_config_text() -> Iterator[str]:
    # Forced fallbacks and shape mode change what a trace records.
    yield f"force_fallback={lazy_bindings.force_fallback()}"
    yield f"symbolic_shapes={lazy_bindings.symbolic_shape_mode()}"


def _backend_text() -> Iterator[str]:
    # The TorchScript backend runs on CUDA when LTC_TS_CUDA is set at all.
    yield "TorchScript"
    yield "CUDA" if "LTC_TS_CUDA" in os.environ else "CPU"

def graph_digest(model: fx.GraphModule) -> str:
    """The ``graph`` part of ``model``'s key: a hash of its generated code
    and of the leaf modules' state that the code leaves out."""
    return hash_lines(_graph_text(model))


def graph_parts(model: fx.GraphModule, *, tensors: Mapping[str, torch.Tensor] | None = None,
                digest: str | None = None) -> dict[str, str]:
    """The parts of ``model``'s key that the graph alone decides: its code
    and leaf modules (``graph``) and the layouts of the tensors it holds
    (``module_tensors``). Stored with a program's graph, so that a warm
    start looks the graph's plan up without rebuilding the graph
    (docs/torch/dynamo.md#program-stores-graph-key-parts).

    ``tensors`` is ``module_tensors(model)`` where the caller has it already;
    ``digest`` is ``graph_digest(model)``, where the caller holds it from an
    entry whose own key covers this graph (a partitioning plan's regions):
    generating a region's code only to hash it was the largest part of
    looking its entry up on a warm start.
    """
    tensors = module_tensors(model) if tensors is None else tensors
    return {"graph": digest if digest is not None else graph_digest(model),
            "module_tensors": hash_lines(_tensor_signatures(tensors))}


def key_of(graph: Mapping[str, str], example_inputs: Sequence[Any]) -> CacheKey:
    """The key of tracing the graph whose :func:`graph_parts` are ``graph``
    on inputs laid out like ``example_inputs``, in this process's torch and
    LTC settings. Raises :class:`UncacheableGraph` for an input with no
    stable signature."""
    parts = {
        "schema": hash_lines([f"schema={SCHEMA_VERSION}"]),
        "torch": hash_lines([torch.__version__, str(torch.version.git_version)]),
        "backend": hash_lines(_backend_text()),
        "graph": graph["graph"],
        "module_tensors": graph["module_tensors"],
        "inputs": hash_lines(_value_signature(v) for v in example_inputs),
        "lazy_config": hash_lines(_lazy_config_text()),
    }
    return key_from_parts(parts)


def compute_key(model: fx.GraphModule, example_inputs: Sequence[Any], *,
                tensors: Mapping[str, torch.Tensor] | None = None,
                digest: str | None = None) -> CacheKey:
    """The key of tracing ``model`` on inputs laid out like ``example_inputs``
    (``tensors`` and ``digest`` as for :func:`graph_parts`). Raises
    :class:`UncacheableGraph` for an input with no stable signature."""
    return key_of(graph_parts(model, tensors=tensors, digest=digest), example_inputs)
