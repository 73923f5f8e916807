"""Warm start against cold start and against its floor, in fresh processes.

    python -m tools.bench.warm_start                  # every section
    python -m tools.bench.warm_start --sections extract --repeats 7
    python -m tools.bench.warm_start --sections compile --model mlp32

Sections (each process imports torch and ltc_cache and builds the model
before the clock starts; the time is from the call to the first result):

- ``extract``: ``ltc_cache.extract_compiled_graph`` then the first call of
  the result, cold (an empty cache directory) and warm (the directory a
  cold run filled), beside the floor: reading the entry (open the store,
  get, decode), parsing its IR and the executor's first call alone. A
  breakdown of the warm path stage by stage says where warm exceeds the
  floor;
- ``compile``: ``torch.compile(model, backend="ltc_cache")`` against
  Inductor (FX graph cache and AOTAutograd cache on), both warm: the first
  call of the compiled model in a fresh process whose caches an earlier
  process filled. Dynamo's capture is part of both.

Runs of one kind alternate with the others, so load from other processes
falls on all alike; each reports its median and best. The models are
``zoo/fx_models.py``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.harness import table, with_import_roots

# One process's measurement; argv: mode, model, width, [key].
_CHILD = r"""
import json, os, sys, time
mode, model_name, width = sys.argv[1], sys.argv[2], int(sys.argv[3])
import torch
from torch import fx
torch.set_num_threads(1)
from zoo.fx_models import build
import ltc_cache, ltc_cache.graph.cache, ltc_cache.compile_backend.backend
import ltc_cache.entries.entry, ltc_cache.graph.graph_keys
from ltc_cache.store import DiskStore
if os.environ.get("BENCH_IR_AS_TRACED"):  # store the IR unrewritten, to compare
    import ltc_cache.graph.rewrites  # the cache imports rewrites when it traces, from here
    ltc_cache.graph.rewrites.rewrite = lambda extraction: extraction
model, example = build(model_name, width)
gm = fx.symbolic_trace(model)
directory = os.environ["LTC_CACHE_DIR"]
clock = time.perf_counter
report = {}
with torch.no_grad():
    if mode == "extract":
        start, cpu = clock(), time.process_time()
        compiled = ltc_cache.extract_compiled_graph(gm, example)
        compiled(*example)
        report["ms"] = (clock() - start) * 1e3
        report["cpu_ms"] = (time.process_time() - cpu) * 1e3
        report["stats"] = ltc_cache.stats()
    elif mode == "floor":
        from ltc_cache.entries.entry import decode
        from ltc_cache.graph.graph_keys import module_tensors
        from ltc_cache.graph.replay import build_function
        key = sys.argv[4]
        start, cpu = clock(), time.process_time()
        store = DiskStore(directory)
        entry = decode(store.get(key), expected_key=key)
        read = clock()
        function = build_function(entry.ir)
        parsed, parsed_cpu = clock(), time.process_time()
        live = module_tensors(gm)  # binding: not part of the floor
        inputs = [example[s.ref] if s.kind == "arg" else live[s.ref] if s.kind == "attr"
                  else s.ref for s in entry.inputs]
        bound, bound_cpu = clock(), time.process_time()
        torch._C._set_graph_executor_optimize(False)
        function(*inputs)
        done = clock()
        report["ms"] = (parsed - start + done - bound) * 1e3
        report["cpu_ms"] = (parsed_cpu - cpu + time.process_time() - bound_cpu) * 1e3
        report["stages"] = {"read": (read - start) * 1e3, "parse": (parsed - read) * 1e3,
                            "first call": (done - bound) * 1e3}
    elif mode == "breakdown":
        from ltc_cache import CacheConfig, GraphCache
        from ltc_cache.entries.entry import decode
        from ltc_cache.graph.graph_keys import compute_key, module_tensors
        from ltc_cache.graph.replay import CompiledGraph, build_function, check_usable
        stages = {}
        def stage(name, start):  # CPU time: steadier than wall time on a busy machine
            now = time.process_time(); stages[name] = (now - start) * 1e3; return now
        t = start = time.process_time()
        wall = clock()
        config = CacheConfig.from_env()
        store = DiskStore(config.directory)
        t = stage("open store", t)
        tensors = module_tensors(gm)
        t = stage("module tensors", t)
        key = compute_key(gm, example, tensors=tensors).digest
        t = stage("key", t)
        data = store.get(key)
        t = stage("get", t)
        entry = decode(data, expected_key=key, secret=config.secret)
        t = stage("decode", t)
        function = build_function(entry.ir)
        t = stage("parse", t)
        check_usable(entry, function, tensors, len(example))
        t = stage("check entry", t)
        compiled = CompiledGraph(entry, function, gm, tensors=tensors)
        t = stage("bind", t)
        compiled(*example)
        t = stage("first call", t)
        report["ms"] = (clock() - wall) * 1e3
        report["cpu_ms"] = (t - start) * 1e3
        report["stages"] = stages
    elif mode in ("compile-ltc", "compile-inductor", "compile-eager"):
        if mode == "compile-inductor":
            import torch._functorch.config, torch._inductor.config
            torch._inductor.config.fx_graph_cache = True
            torch._functorch.config.enable_autograd_cache = True
        elif mode == "compile-ltc":  # the backend's own part (key, lookup, parse)
            backend_ms = []
            call = ltc_cache.compile_backend.backend.LtcBackend.__call__
            def timed(self, *args, **kwargs):
                t = clock()
                try:
                    return call(self, *args, **kwargs)
                finally:
                    backend_ms.append((clock() - t) * 1e3)
            ltc_cache.compile_backend.backend.LtcBackend.__call__ = timed
        # backend="eager": Dynamo's capture alone, which every backend pays.
        compiled = torch.compile(model, backend=mode.removeprefix("compile-").replace(
            "ltc", "ltc_cache"))
        start, cpu = clock(), time.process_time()
        compiled(*example)
        report["ms"] = (clock() - start) * 1e3
        report["cpu_ms"] = (time.process_time() - cpu) * 1e3
        report["stats"] = ltc_cache.stats()
        if mode == "compile-ltc":
            report["backend_ms"] = sum(backend_ms)
print(json.dumps(report))
"""


def child(mode: str, model: str, width: int, env: dict[str, str], *extra: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", _CHILD, mode, model, str(width), *extra],
                          capture_output=True, text=True, env=with_import_roots(dict(env)),
                          check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} child failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summary(runs: list[dict], field: str = "ms") -> tuple[float, float]:
    times = [r[field] for r in runs]
    return statistics.median(times), min(times)


def key_of(model: str, width: int) -> str:
    from torch import fx

    from ltc_cache.graph.graph_keys import compute_key
    from zoo.fx_models import build

    module, example = build(model, width)
    return compute_key(fx.symbolic_trace(module), example).digest


def extract_section(model: str, width: int, repeats: int) -> str:
    base = dict(os.environ)
    key = key_of(model, width)
    with tempfile.TemporaryDirectory(prefix="ltc-bench-warm-") as tmp:
        warm_env = dict(base, LTC_CACHE_DIR=str(Path(tmp) / "warm"))
        traced_env = dict(base, LTC_CACHE_DIR=str(Path(tmp) / "traced"))
        first = child("extract", model, width, warm_env)  # fills the warm directory
        assert first["stats"]["stores"] == 1, first
        first = child("extract", model, width, dict(traced_env, BENCH_IR_AS_TRACED="1"))
        assert first["stats"]["stores"] == 1, first
        runs: dict[str, list[dict]] = {k: [] for k in (
            "cold", "warm", "floor", "breakdown", "warm, IR as traced", "floor, IR as traced")}
        for i in range(repeats):
            cold_env = dict(base, LTC_CACHE_DIR=str(Path(tmp) / f"cold{i}"))
            runs["cold"].append(child("extract", model, width, cold_env))
            runs["warm"].append(child("extract", model, width, warm_env))
            runs["floor"].append(child("floor", model, width, warm_env, key))
            runs["breakdown"].append(child("breakdown", model, width, warm_env))
            runs["warm, IR as traced"].append(child("extract", model, width, traced_env))
            runs["floor, IR as traced"].append(child("floor", model, width, traced_env, key))
        assert all(r["stats"]["traces"] == 1 for r in runs["cold"])
        assert all(r["stats"]["hits"] == 1 and r["stats"]["traces"] == 0
                   for r in (*runs["warm"], *runs["warm, IR as traced"]))
    rows = [["start", "wall median", "best", "/ cold", "/ floor", "CPU median", "best",
             "/ cold", "/ floor"]]
    kinds = ("cold", "warm", "floor", "warm, IR as traced", "floor, IR as traced")
    wall = {k: summary(runs[k]) for k in kinds}
    cpu = {k: summary(runs[k], "cpu_ms") for k in kinds}
    for name in kinds:
        rows.append([name, f"{wall[name][0]:,.1f} ms", f"{wall[name][1]:,.1f} ms",
                     f"{wall[name][0] / wall['cold'][0]:.3f}",
                     f"{wall[name][0] / wall['floor'][0]:.2f}",
                     f"{cpu[name][0]:,.1f} ms", f"{cpu[name][1]:,.1f} ms",
                     f"{cpu[name][0] / cpu['cold'][0]:.3f}",
                     f"{cpu[name][0] / cpu['floor'][0]:.2f}"])
    stage_rows = [["stage", "wall ms (median)", "CPU ms (median)"]]
    for name in runs["floor"][0]["stages"]:
        stage_rows.append([f"floor: {name}", _median(runs["floor"], name), ""])
    for name in runs["breakdown"][0]["stages"]:
        stage_rows.append([f"warm: {name}", "", _median(runs["breakdown"], name)])
    stage_rows.append(["warm, all stages", f"{summary(runs['breakdown'])[0]:.1f}",
                       f"{summary(runs['breakdown'], 'cpu_ms')[0]:.1f}"])
    return (f"### Warm start of extract_compiled_graph, {model} (width {width}), "
            f"{repeats} fresh processes each\n\n{table(rows)}\n\n{table(stage_rows)}")


def _median(runs: list[dict], stage: str) -> str:
    return f"{statistics.median(r['stages'][stage] for r in runs):.1f}"


def compile_section(model: str, width: int, repeats: int) -> str:
    base = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="ltc-bench-compile-") as tmp:
        env = dict(base, LTC_CACHE_DIR=str(Path(tmp) / "ltc"),
                   TORCHINDUCTOR_CACHE_DIR=str(Path(tmp) / "inductor"))
        cold = {"compile-ltc": [child("compile-ltc", model, width, env)],
                "compile-inductor": [child("compile-inductor", model, width, env)]}
        runs: dict[str, list[dict]] = {"compile-ltc": [], "compile-inductor": [],
                                       "compile-eager": []}
        for _ in range(repeats):
            for mode in runs:
                runs[mode].append(child(mode, model, width, env))
    assert all(r["stats"]["hits"] >= 1 and r["stats"]["traces"] == 0
               for r in runs["compile-ltc"]), runs["compile-ltc"]
    ltc, inductor = summary(runs["compile-ltc"]), summary(runs["compile-inductor"])
    ltc_cpu = summary(runs["compile-ltc"], "cpu_ms")
    inductor_cpu = summary(runs["compile-inductor"], "cpu_ms")
    dynamo, dynamo_cpu = summary(runs["compile-eager"]), summary(runs["compile-eager"], "cpu_ms")
    rows = [["torch.compile, first call", "cold (one run)", "warm median", "warm best",
             "warm CPU median"]]
    for name, mode, (med, best), (cpu, _) in (
            ("ltc_cache backend", "compile-ltc", ltc, ltc_cpu),
            ("Inductor (FX graph + AOTAutograd caches)", "compile-inductor", inductor,
             inductor_cpu)):
        rows.append([name, f"{cold[mode][0]['ms']:,.0f} ms", f"{med:,.0f} ms",
                     f"{best:,.0f} ms", f"{cpu:,.0f} ms"])
    rows.append(['Dynamo alone (backend="eager")', "-", f"{dynamo[0]:,.0f} ms",
                 f"{dynamo[1]:,.0f} ms", f"{dynamo_cpu[0]:,.0f} ms"])
    backend = statistics.median(r["backend_ms"] for r in runs["compile-ltc"])
    return (f"### Warm start through torch.compile, {model} (width {width}), "
            f"{repeats} fresh processes each\n\n{table(rows)}\n\n"
            f"of the ltc_cache warm start, the backend (key, lookup, parse, bind) took "
            f"{backend:,.0f} ms (median), the rest is Dynamo and the first call; "
            f"ltc_cache / Inductor, warm: {ltc[0] / inductor[0]:.2f}x median "
            f"({ltc[1] / inductor[1]:.2f}x best; CPU {ltc_cpu[0] / inductor_cpu[0]:.2f}x); "
            f"Dynamo alone / Inductor, warm: {dynamo[0] / inductor[0]:.2f}x median")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.warm_start",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--sections", nargs="+", default=["extract", "compile"])
    parser.add_argument("--model", default="mlp128")
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if "extract" in args.sections:
        print(extract_section(args.model, args.width, args.repeats), "\n", flush=True)
    if "compile" in args.sections:
        print(compile_section(args.model, args.width, args.repeats), "\n", flush=True)


if __name__ == "__main__":
    main()
