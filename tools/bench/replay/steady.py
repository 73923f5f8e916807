"""``python -m tools.bench.replay --sections steady``: one call of a cached
graph against eager, the original LTC replay and Inductor, what each
rewrite of the stored IR bought, and the compute kernels' floor."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import time
import timeit
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import fx

from tools.bench.replay.timing import interleaved, ms, ratio, without_optimize
from tools.harness import table
from zoo.fx_models import build


def compiled_from(extraction: Any, gm: fx.GraphModule) -> Any:
    from ltc_cache.entries.entry import Entry
    from ltc_cache.graph.replay import CompiledGraph, build_function

    entry = Entry("", extraction.ir, extraction.inputs, extraction.outputs, extraction.updates,
                  {})
    return CompiledGraph(entry, build_function(extraction.ir), gm)


def rewritten(extraction: Any, *steps: Callable[..., int]) -> Any:
    """``extraction`` with only the rewrite functions ``steps`` applied."""
    from ltc_cache.graph.rewrites import bool_list_constants, linears, views_for_copies

    graph = torch._C.parse_ir(extraction.ir, parse_tensor_constants=True)
    inputs = list(extraction.inputs)
    for step in steps:
        if step in (views_for_copies, linears, bool_list_constants):  # the graph alone
            step(graph)
        else:
            step(graph, inputs)
    return dataclasses.replace(extraction, ir=str(graph), inputs=tuple(inputs))


def steady(name: str, width: int, rounds: int, inductor: bool,
           clock: Callable[[], float] = time.perf_counter) -> tuple[str, dict[str, float]]:
    from ltc_cache import CacheConfig, GraphCache
    from ltc_cache.graph.extract import trace
    from ltc_cache.graph.rewrites import (
        bool_list_constants,
        drop_dead_code,
        fold_scalars,
        views_for_copies,
    )
    from ltc_cache.store import MemoryStore

    model, example = build(name, width)
    gm = fx.symbolic_trace(model)
    variants: dict[str, Callable[[], Any]] = {}
    notes = []
    with torch.no_grad():
        expected = model(*example)
        variants["eager"] = lambda: model(*example)

        traced = trace(gm, example)  # first: it starts LTC's TorchScript backend

        from torch._lazy.extract_compiled_graph import extract_compiled_graph as original
        replay = original(gm, example)
        variants["original replay"] = lambda: replay(*example)

        as_traced = compiled_from(traced, gm)
        views = compiled_from(rewritten(traced, views_for_copies), gm)
        scalars = compiled_from(rewritten(traced, views_for_copies, fold_scalars,
                                          bool_list_constants, drop_dead_code), gm)
        variants["ltc_cache, IR as traced"] = lambda: as_traced(*example)
        variants["ltc_cache, + views"] = lambda: views(*example)
        variants["ltc_cache, + scalars, dead code"] = lambda: scalars(*example)

        cache = GraphCache(CacheConfig.from_env({"LTC_CACHE_DIR": tempfile.gettempdir()}),
                           store=MemoryStore())
        compiled = cache.extract_compiled_graph(gm, example)
        variants[FINAL] = lambda: compiled(*example)
        for variant in (as_traced, views, scalars, compiled):
            torch.testing.assert_close(variant(*example)[0], expected, rtol=1e-4, atol=1e-5)
        notes.append(f"graph nodes {_nodes(traced.ir)} -> {_nodes(compiled.entry.ir)}, "
                     f"inputs {len(traced.inputs)} -> {len(compiled.entry.inputs)}, "
                     f"IR {len(traced.ir) / 1024:.0f} KB -> "
                     f"{len(compiled.entry.ir) / 1024:.0f} KB")

        with contextlib.suppress(Exception):  # the backend may not be installed
            import ltc_cache.compile_backend.backend  # noqa: F401

            via_compile = torch.compile(model, backend="ltc_cache")
            with _env(LTC_CACHE_DIR=tempfile.mkdtemp(prefix="ltc-bench-")):
                via_compile(*example)
            torch.testing.assert_close(via_compile(*example), expected, rtol=1e-4, atol=1e-5)
            variants["ltc_cache via torch.compile"] = lambda: via_compile(*example)
        if inductor:
            start = time.perf_counter()
            induct = torch.compile(model)
            induct(*example)
            notes.append(f"Inductor compile {time.perf_counter() - start:.1f} s")
            variants["Inductor"] = lambda: induct(*example)

        calls = max(3, int(0.05 / _one_call(variants["eager"])))
        timings = interleaved(variants, rounds=rounds, calls=calls, clock=clock)
        floor, whole, by_op = kernel_floor(compiled, gm, example, rounds=rounds, calls=calls)

    eager, original_t = timings["eager"], timings["original replay"]
    rows = [["variant", "per call (median)", "best", "vs eager", "vs original replay"]]
    for variant, t in timings.items():
        rows.append([variant, ms(t.median), ms(t.best), ratio(t, eager), ratio(t, original_t)])
    ours = timings[FINAL]
    # The floor as a share of our graph's time measured beside it, times our
    # ratio to the original from the interleaved rounds.
    floor_vs_original = floor / whole * ours.median / original_t.median
    summary = {"vs_eager": ours.median / eager.median,
               "vs_original": ours.median / original_t.median,
               "floor_vs_original": floor_vs_original}
    kernels = ", ".join(f"{n} {op.removeprefix('aten::')}" for op, n in by_op)
    notes.append(f"compute kernels (the floor; {kernels}): {ms(floor)} CPU, "
                 f"{floor / whole:.2f} of the stored graph's best CPU time beside it "
                 f"({ms(whole)}), so {floor_vs_original:.2f}x the original replay")
    text = (f"### {name} (width {width}; {rounds} rounds of {calls} calls)\n\n"
            f"{table(rows)}\n\n" + "; ".join(notes))
    return text, summary


FINAL = "ltc_cache (+ linear: every rewrite)"

# Nodes that are not compute kernels: views (reshape may copy, and the floor
# leaves that copy out too), the contiguous made for an output, constants
# and containers.
_NOT_KERNELS = ("aten::t", "aten::reshape", "aten::view", "aten::transpose", "aten::permute",
                "aten::select", "aten::slice", "aten::squeeze", "aten::unsqueeze",
                "aten::expand", "aten::detach", "aten::alias", "aten::narrow",
                "aten::diagonal", "aten::unfold", "aten::contiguous")


def kernel_floor(compiled: Any, gm: fx.GraphModule, example: list[torch.Tensor], *,
                 rounds: int, calls: int) -> tuple[float, float, list[tuple[str, int]]]:
    """What the stored graph's compute kernels cost inside it: every node but
    views (and the copies ``reshape`` makes), ``contiguous``, constants and
    containers. The graph is timed against a copy of itself in which each
    such node runs twice, the second time on the same inputs with its result
    dropped at once (its ``dim`` is all that is kept), in interleaved
    rounds; the difference is the kernels' cost with their allocations and
    interpreter steps, measured on warm inputs, so a lower bound for any
    replay that runs the same kernels. Timed in this thread's CPU time,
    which time lost to other processes on a busy machine does not inflate.
    Returns the best CPU seconds per call of the kernels and of the whole
    graph, and the count of each op counted."""
    from ltc_cache.graph.graph_keys import module_tensors

    live = module_tensors(gm)
    inputs = [example[s.ref] if s.kind == "arg" else live[s.ref] if s.kind == "attr" else s.ref
              for s in compiled.entry.inputs]
    graph = torch._C.parse_ir(compiled.entry.ir)
    kept, counted = [], {}
    for node in list(graph.nodes()):
        if node.kind().startswith("prim::") or node.kind() in _NOT_KERNELS:
            continue
        counted[node.kind()] = counted.get(node.kind(), 0) + 1
        twin = graph.create(node.kind(), list(node.inputs()), node.outputsSize())
        twin.insertAfter(node)
        for old, new in zip(node.outputs(), twin.outputs(), strict=True):
            new.setType(old.type())
        for out in twin.outputs():
            if isinstance(out.type(), torch._C.TensorType):
                dim = graph.create("aten::dim", [out], 1)
                dim.insertAfter(twin)
                dim.output().setType(torch._C.IntType.get())
                kept.append(dim.output())
    with graph.insert_point_guard(graph.return_node()):
        dims = graph.insertNode(graph.create("prim::ListConstruct", kept, 1))
    dims.output().setType(torch._C.ListType(torch._C.IntType.get()))
    graph.registerOutput(dims.output())
    graph.makeMultiOutputIntoTuple()
    twice = torch._C._create_function_from_graph("kernels_twice", graph)
    once = compiled._fn
    timings = interleaved({"once": without_optimize(lambda: once(*inputs)),
                           "twice": without_optimize(lambda: twice(*inputs))},
                          rounds=rounds, calls=calls, clock=time.thread_time)
    ordered = sorted(counted.items(), key=lambda kv: -kv[1])
    # Best rounds: the difference of two medians swings with the load.
    return timings["twice"].best - timings["once"].best, timings["once"].best, ordered


def _nodes(ir: str) -> int:
    return sum(1 for _ in torch._C.parse_ir(ir, parse_tensor_constants=True).nodes())


def _one_call(fn: Callable[[], Any]) -> float:
    return min(timeit.repeat(fn, number=1, repeat=5))


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
