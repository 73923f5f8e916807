"""``python -m tools.bench.replay``'s sections on replay's own costs:
``wrapper`` (the wrapper around a graph function), ``executor`` (the
TorchScript executor's optimisation settings) and ``lookup`` (a hit
against the number of entries in the disk store)."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import fx

from tools.bench.replay.timing import interleaved, ms, us, without_optimize
from tools.harness import table
from zoo.fx_models import TenInTenOut, build

# ---------------------------------------------------------------- wrapper


class _Stub:
    """Stands in for the TorchScript function: returns fixed results, so that
    what is timed is the wrapper alone."""

    def __init__(self, results: Any) -> None:
        self.results = results

    def __call__(self, *inputs: Any) -> Any:
        return self.results


def _before(compiled: Any) -> Callable[..., list[Any]]:
    """The per-call path as it was before this change, with the same
    per-graph preparation (kept here to measure what the change bought):
    inputs bound by a Python loop, the executor switch through
    ``torch.jit.optimized_execution``, outputs picked one by one through a
    function."""
    entry = compiled.entry
    template = [None if s.kind == "arg" else s.ref for s in entry.inputs]  # no attrs here
    arg_slots = [(i, s.ref) for i, s in enumerate(entry.inputs) if s.kind == "arg"]
    outputs = [(s.kind, s.ref) for s in entry.outputs]

    def call(*args: Any) -> list[Any]:
        inputs = template.copy()
        for slot, index in arg_slots:
            inputs[slot] = args[index]
        with torch.jit.optimized_execution(False):
            results = compiled._fn(*inputs)
        return [_pick(kind, ref, args, results) for kind, ref in outputs]
    return call


def _pick(kind: str, ref: Any, args: Any, results: Any) -> Any:
    if kind == "out":
        return results[ref]
    if kind == "arg":
        return args[ref]
    return ref


def wrapper(rounds: int) -> str:
    from ltc_cache import CacheConfig, GraphCache
    from ltc_cache.store import MemoryStore

    gm = fx.symbolic_trace(TenInTenOut())
    args = tuple(torch.randn(2) for _ in range(10))
    cache = GraphCache(CacheConfig.from_env({"LTC_CACHE_DIR": tempfile.gettempdir()}),
                       store=MemoryStore())
    with torch.no_grad():
        compiled = cache.extract_compiled_graph(gm, args)
        fn = compiled._fn
        results = fn(*args)
        before_outputs = [(s.kind, s.ref) for s in compiled.entry.outputs]
        bare_inputs = list(args)

        def bare() -> Any:  # the TorchScript call alone, switch set outside
            return fn(*bare_inputs)

        real = interleaved({"wrapped": lambda: compiled(*args),
                            "bare": without_optimize(bare)}, rounds=rounds, calls=2000)
        compiled._fn = _Stub(results)
        before = _before(compiled)
        stub = interleaved({
            "after": lambda: compiled(*args),
            "before": lambda: before(*args),
            "stub alone": lambda: compiled._fn(*args),
        }, rounds=rounds, calls=20000)
        compiled._fn = fn
    assert len(before_outputs) == 10
    rows = [["measure", "median", "best"],
            ["wrapped call (real graph)", us(real["wrapped"].median), us(real["wrapped"].best)],
            ["TorchScript call alone", us(real["bare"].median), us(real["bare"].best)],
            ["wrapper = difference", us(real["wrapped"].median - real["bare"].median),
             us(real["wrapped"].best - real["bare"].best)],
            ["wrapper around a stub, after", us(stub["after"].median - stub["stub alone"].median),
             us(stub["after"].best - stub["stub alone"].best)],
            ["wrapper around a stub, before",
             us(stub["before"].median - stub["stub alone"].median),
             us(stub["before"].best - stub["stub alone"].best)]]
    return "### Wrapper cost, 10 inputs / 10 outputs\n\n" + table(rows)


# --------------------------------------------------------------- executor


def executor(name: str, width: int, rounds: int) -> str:
    """Per-call times of the first calls and of steady calls of one graph
    function under three executor settings: optimisation off around every
    call (what replay does), off around the first call only, and on."""
    from ltc_cache import CacheConfig, GraphCache
    from ltc_cache.graph.replay import build_function
    from ltc_cache.store import MemoryStore

    model, example = build(name, width)
    gm = fx.symbolic_trace(model)
    cache = GraphCache(CacheConfig.from_env({"LTC_CACHE_DIR": tempfile.gettempdir()}),
                       store=MemoryStore())
    rows = [["executor optimisation", "call 1", "call 2", "call 3", "call 4", "steady (median)",
             "steady (best)"]]
    with torch.no_grad():
        compiled = cache.extract_compiled_graph(gm, example)
        from ltc_cache.graph.graph_keys import module_tensors
        live = module_tensors(gm)
        inputs = [example[s.ref] if s.kind == "arg" else live[s.ref] if s.kind == "attr"
                  else s.ref for s in compiled.entry.inputs]
        functions = {}
        for mode in ("off for every call", "off for the first call only", "on"):
            fn = build_function(compiled.entry.ir)
            firsts = []
            for i in range(4):
                off = mode == "off for every call" or (mode != "on" and i == 0)
                torch._C._set_graph_executor_optimize(not off)
                start = time.perf_counter()
                fn(*inputs)
                firsts.append(time.perf_counter() - start)
                torch._C._set_graph_executor_optimize(True)
            functions[mode] = (fn, firsts)

        def steady_call(fn: Callable[..., Any], off: bool) -> Callable[[], Any]:
            return without_optimize(lambda: fn(*inputs)) if off else lambda: fn(*inputs)

        timings = interleaved({mode: steady_call(fn, mode == "off for every call")
                               for mode, (fn, _) in functions.items()}, rounds=rounds, calls=10)
    for mode, (_, firsts) in functions.items():
        rows.append([mode, *(ms(t) for t in firsts), ms(timings[mode].median),
                     ms(timings[mode].best)])
    return f"### Executor settings, {name} (width {width})\n\n" + table(rows)


# ----------------------------------------------------------------- lookup


def lookup(counts: list[int], rounds: int, width: int) -> str:
    from ltc_cache import CacheConfig, GraphCache
    from ltc_cache.entries.entry import decode, encode
    from ltc_cache.graph.graph_keys import compute_key
    from ltc_cache.store import DiskStore, MemoryStore

    model, example = build("mlp32", width)
    gm = fx.symbolic_trace(model)
    filler_gm = fx.symbolic_trace(TenInTenOut())
    filler_args = [torch.randn(2) for _ in range(10)]
    rows = [["entries", "store.get + decode (median)", "best", "whole hit (median)", "best"]]
    with tempfile.TemporaryDirectory(prefix="ltc-bench-lookup-") as tmp, torch.no_grad():
        directory = Path(tmp)
        config = CacheConfig.from_env({"LTC_CACHE_DIR": str(directory)})
        GraphCache(config).extract_compiled_graph(gm, example)  # the measured entry
        key = compute_key(gm, example).digest
        filler = GraphCache(config, store=MemoryStore())
        small = filler.extract_compiled_graph(filler_gm, filler_args).entry
        store = DiskStore(directory)
        stored = 1
        for count in counts:
            while stored < count:  # small entries under made-up keys
                fake = f"{stored:064x}"
                store.put(fake, encode(dataclasses.replace(small, key=fake)))
                stored += 1

            def get() -> Any:
                return decode(store.get(key), expected_key=key)

            def whole_hit() -> Any:
                return GraphCache(config, store=store).extract_compiled_graph(gm, example)

            t = interleaved({"get": get, "hit": whole_hit}, rounds=rounds, calls=5)
            rows.append([f"{count:,}", ms(t["get"].median), ms(t["get"].best),
                         ms(t["hit"].median), ms(t["hit"].best)])
        store.close()
    return ("### Lookup cost against the number of entries (mlp32 entry among small ones)\n\n"
            + table(rows))
