"""Steady-state replay, side by side in one run, as ratios.

    python -m tools.bench_replay                       # every section
    python -m tools.bench_replay --sections steady --models mlp32
    python -m tools.bench_replay --sections wrapper lookup memory
    python -m tools.bench_replay --sections steady --clock cpu  # busy machine

Sections:

- ``steady``: one call of a cached graph against eager, the original
  ``torch._lazy.extract_compiled_graph`` replay and Inductor, on a 32-block
  and a 128-block MLP and a torch.nn.TransformerEncoder; with what each
  rewrite of the stored IR bought (the IR as traced, views only, scalars
  and dead code, all rewrites) and, where the ``ltc_cache`` backend is
  installed, the same graph through ``torch.compile``; and the floor no
  rewrite of the IR can pass: the stored graph's compute kernels (every
  node but views, copies and constants), each timed alone on inputs laid
  out as in the graph, summed;
- ``executor``: the first calls and steady calls of one graph function with
  the TorchScript executor's optimisation off around every call (what
  replay does), off around the first call only, and on;
- ``wrapper``: the wrapper's own cost per call for a 10-input/10-output
  graph (binding arguments, executor switch, building the output list);
- ``lookup``: the cost of a hit at 1, 1,000 and 10,000 entries in the disk
  store (store read alone, and the whole hit in a fresh GraphCache);
- ``memory``: peak RSS of a warm process against an eager one, in fresh
  subprocesses.

Variants are timed in interleaved rounds (one batch of calls of each per
round), so load from other processes on a shared machine falls on all of
them alike; each variant reports its best and median round, and ratios use
medians (best in brackets). Torch runs on ``--threads`` threads (1 by
default, so that the BLAS pool does not fight other processes for cores).
The models are ``zoo/fx_models.py``'s.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import fx

from tools.harness import table, with_import_roots
from zoo.fx_models import TenInTenOut, build

# --------------------------------------------------------------- measuring


@dataclasses.dataclass
class Timing:
    rounds: list[float] = dataclasses.field(default_factory=list)  # seconds per call

    @property
    def best(self) -> float:
        return min(self.rounds)

    @property
    def median(self) -> float:
        return statistics.median(self.rounds)


def interleaved(variants: dict[str, Callable[[], Any]], *, rounds: int, calls: int,
                warmup: int = 3, clock: Callable[[], float] = time.perf_counter
                ) -> dict[str, Timing]:
    """Time each variant in ``rounds`` rounds of ``calls`` calls, one round of
    every variant after the other, by ``clock``."""
    for fn in variants.values():
        for _ in range(warmup):
            fn()
    timings = {name: Timing() for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            start = clock()
            for _ in range(calls):
                fn()
            timings[name].rounds.append((clock() - start) / calls)
    return timings


def us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} us"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.3f} ms"


def ratio(a: Timing, b: Timing) -> str:
    return f"{a.median / b.median:.2f}x ({a.best / b.best:.2f}x)"


# ------------------------------------------------------------ steady state


def compiled_from(extraction: Any, gm: fx.GraphModule) -> Any:
    from ltc_cache.graph.entry import Entry
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
    from ltc_cache.graph.keys import module_tensors

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
    timings = interleaved({"once": _without_optimize(lambda: once(*inputs)),
                           "twice": _without_optimize(lambda: twice(*inputs))},
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
                            "bare": _without_optimize(bare)}, rounds=rounds, calls=2000)
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


def _without_optimize(fn: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        torch._C._set_graph_executor_optimize(False)
        try:
            return fn()
        finally:
            torch._C._set_graph_executor_optimize(True)
    return run


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
        from ltc_cache.graph.keys import module_tensors
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
            return _without_optimize(lambda: fn(*inputs)) if off else lambda: fn(*inputs)

        timings = interleaved({mode: steady_call(fn, mode == "off for every call")
                               for mode, (fn, _) in functions.items()}, rounds=rounds, calls=10)
    for mode, (_, firsts) in functions.items():
        rows.append([mode, *(ms(t) for t in firsts), ms(timings[mode].median),
                     ms(timings[mode].best)])
    return f"### Executor settings, {name} (width {width})\n\n" + table(rows)


# ----------------------------------------------------------------- lookup


def lookup(counts: list[int], rounds: int, width: int) -> str:
    from ltc_cache import CacheConfig, GraphCache
    from ltc_cache.graph.entry import decode, encode
    from ltc_cache.graph.keys import compute_key
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


# ----------------------------------------------------------------- memory

_MEMORY_CHILD = r"""
import json, sys, time
mode, width = sys.argv[1], int(sys.argv[2])
import torch
from torch import fx
torch.set_num_threads(1)
from zoo.fx_models import build
model, example = build("mlp128", width)
gm = fx.symbolic_trace(model)
def status():
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent
    # across fork and exec, so a child of a big process would report its size.
    # RssAnon is the process's own memory; RssFile the pages of mapped files
    # (libraries) it touched, shared with other processes mapping them.
    fields = {}
    for line in open("/proc/self/status"):
        name, _, value = line.partition(":")
        if name in ("VmHWM", "RssAnon", "RssFile"):
            fields[name] = int(value.split()[0]) * 1024
    return fields
def peak():
    return status()["VmHWM"]
before = imported = extracted = peak()
stats = {}
with torch.no_grad():
    if mode == "eager":
        run = model
    else:
        import ltc_cache, ltc_cache.graph.cache, ltc_cache.store
        imported = peak()
        run = ltc_cache.extract_compiled_graph(gm, example)
        extracted = peak()
    run(*example)
    first = peak()
    for _ in range(19):
        run(*example)
    if mode != "eager":
        stats = ltc_cache.stats()
end = status()
print(json.dumps({"before": before, "imported": imported, "extracted": extracted,
                  "first": first, "peak": end["VmHWM"], "anon": end["RssAnon"],
                  "file": end["RssFile"], "stats": stats}))
"""


def memory(width: int, repeats: int) -> str:
    from ltc_cache.store import DiskStore

    rows = [["process", "peak RSS (median)", "after building the model", "growth",
             "of which: import ltc_cache", "the hit", "first call", "19 more calls",
             "at the end: anonymous", "mapped files"]]
    with tempfile.TemporaryDirectory(prefix="ltc-bench-mem-") as tmp:
        env = with_import_roots(dict(os.environ, LTC_CACHE_DIR=tmp))
        filled = _memory_child("warm", width, env)  # fills the cache
        assert filled["stats"]["stores"] == 1, filled
        store = DiskStore(Path(tmp))
        stored = sum(len(store.get(k) or b"") for k in store.keys())  # noqa: SIM118
        store.close()
        results: dict[str, list[dict]] = {"eager": [], "warm": []}
        for _ in range(repeats):
            for mode in results:
                results[mode].append(_memory_child(mode, width, env))
    # A warm process that traced would measure something else.
    assert all(r["stats"]["hits"] == 1 and r["stats"]["traces"] == 0
               for r in results["warm"]), results["warm"]
    fields = ("before", "imported", "extracted", "first", "peak", "anon", "file")
    med = {m: {k: statistics.median(r[k] for r in rs) for k in fields}
           for m, rs in results.items()}
    for mode in ("eager", "warm"):
        m = med[mode]
        rows.append([f"{mode} (mlp128, 20 calls)", _mb(m["peak"]), _mb(m["before"]),
                     _mb(m["peak"] - m["before"]), _mb(m["imported"] - m["before"]),
                     _mb(m["extracted"] - m["imported"]), _mb(m["first"] - m["extracted"]),
                     _mb(m["peak"] - m["first"]), _mb(m["anon"]), _mb(m["file"])])
    budget = med["eager"]["peak"] + stored
    return ("### Peak RSS of a warm process against eager\n\n" + table(rows) +
            f"\n\nstored entries: {stored / 1024:,.0f} KiB; warm peak - (eager peak + stored) = "
            f"{_mb(med['warm']['peak'] - budget)} (anonymous "
            f"{_mb(med['warm']['anon'] - med['eager']['anon'])}, mapped files "
            f"{_mb(med['warm']['file'] - med['eager']['file'])} over eager's at the end)")


def _memory_child(mode: str, width: int, env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", _MEMORY_CHILD, mode, str(width)],
                          capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"memory child failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _mb(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


# ------------------------------------------------------------------- main


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.thread_time}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_replay",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--sections", nargs="+", default=["steady", "executor", "wrapper",
                                                          "lookup", "memory"])
    parser.add_argument("--models", nargs="+", default=["mlp32", "mlp128", "transformer"])
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--entries", type=int, nargs="+", default=[1, 1000, 10000])
    parser.add_argument("--no-inductor", action="store_true")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="steady state in wall time, or in this thread's CPU time, which "
                        "time lost to other processes on a busy machine does not inflate")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gc.collect()
    print(f"torch {torch.__version__}, {args.threads} thread(s), {os.cpu_count()} CPUs, "
          f"steady state in {args.clock} time, load average {os.getloadavg()[0]:.2f}\n")
    if "steady" in args.sections:
        for name in args.models:
            text, summary = steady(name, args.width, args.rounds, not args.no_inductor,
                                   CLOCKS[args.clock])
            print(text, f"\n\nsummary {name}: {json.dumps(summary)}\n", flush=True)
    if "executor" in args.sections:
        print(executor("mlp128", args.width, args.rounds), "\n", flush=True)
    if "wrapper" in args.sections:
        print(wrapper(args.rounds), "\n", flush=True)
    if "lookup" in args.sections:
        print(lookup(args.entries, args.rounds, args.width), "\n", flush=True)
    if "memory" in args.sections:
        print(memory(args.width, repeats=3), "\n", flush=True)


if __name__ == "__main__":
    main()
