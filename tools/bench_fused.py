"""Steady state of the fused tier beside TorchScript replay, eager and Inductor.

Per-call (per-step, per-token) medians of eager, ltc_cache replaying with
TorchScript (``LTC_CACHE_FUSE=off``), ltc_cache with its fused libraries,
and Inductor, side by side in one process, interleaved (A B C D, B C D A,
...), all warm.

    python -m tools.bench_fused [--rows PATTERNS] [--models NAMES] [--modes infer,train]
                                [--threads 1|default|both] [--rounds 15] [--round-ms 50]
                                [--cache DIR] [--reprepare] [--no-first-call]
                                [--prepare off|sync] [--clock auto|wall|cpu] [--new 32]
                                [--json FILE] [--results]

``--results`` writes the one-thread rows into benchmarks/results/: the
suite's into suite_fused.json, the others into steady_state.json, each
refreshing the rows it measured.

Rows (``--rows``: comma-separated ``fnmatch`` patterns over their names):

- ``steady/{gpt2,bert,llama,t5}/infer``: tools/bench_steady.py's models at
  ``--size mid`` (zoo/sized_models.py: hidden 256, 4 layers, sequence 128,
  batch 2);
- ``smallgpt/smallgpt/train``: the small GPT (zoo/small_gpt.py), one
  forward, backward and AdamW step;
- ``tiny/MODEL/infer`` and ``tiny/MODEL/train``: tools/bench_compile.py's
  tiny models (zoo/compile_models.py), inference for all, a training
  step for its training models;
- ``suite/MODEL/{infer,train}``: the suite's models at bench_suite's tiny
  sizes (zoo/suite_models.py); ``--models`` and ``--modes`` filter them;
- ``generate/{gpt2,llama}/decode``: ``generate()`` with transformers' static
  cache (zoo/generate_models.py, ``model.forward`` compiled as
  tools/bench_generate.py does), ms per decoded token, tokens per second.

Inference runs in ``eval()`` under ``no_grad``; a training step is the
mean square of the main output, backward, AdamW (each variant on a copy of
the model of its own). Both ltc_cache variants are ``ltc_cache.compile``
of a copy, in the same process: ``default_cache()`` keeps one GraphCache
per configuration, and a compiled model resolves it on its first call (the
program's, and the backend's when the program's graph compiles), so each
variant makes its first calls under its own ``LTC_CACHE_FUSE``: ``off``, and
for the fused one the default ``background``, which finds every library
stored and queues nothing (a row that queued a graph says so).

Preparation: each row has a directory under ``--cache`` per thread setting
(``t1/``, ``tdefault/``: Inductor specialises its kernels to the thread
count of the compiling process, and a library's key does not hold it),
with ltc_cache's, Inductor's and the program key's directories. The first
run prepares it, at that thread count: a cold child process runs the
fused variant under ``LTC_CACHE_FUSE=--prepare`` (``sync``, the default:
each region compiled by AOTInductor before its first call; ``off``: the
graphs only), then a fusing child compiles any region left without a fused
entry with ``fuse_graph``, as the background worker does (after ``sync``,
usually none), then each stored plan's whole-graph libraries (README,
"Fused libraries": whole plans). Later runs reuse the directory (``--reprepare`` starts it
again). Then, in fresh processes over it: the measuring process (it checks
``fused_loads`` or ``fused_plan_loads`` > 0: a row whose fused variant loaded no library says so),
and, unless ``--no-first-call``, the warm first call of the fused tier, of
the TorchScript tier and of Inductor (its caches warmed by the measuring
process): seconds from the process's start to the end of its first call,
step or request. Every process of a row has the same ``TORCHINDUCTOR_*``
variables, which are part of a library's key.

A library is kept only where it timed faster than TorchScript when it was
built, on one measurement stored for good: on a loaded machine, at the
default thread count above all, that measurement is noise and refusals
("not faster") come and go with the load. Prepare on a quiet machine.

The output: per thread setting, the steady-state table (times, the ratios
fused/Inductor, fused/TorchScript tier, fused/eager: below 1 the fused
tier is faster; the largest difference of each variant from eager on a call
after the first, relative to the output's or the gradients' largest
magnitude, token mismatches for ``generate``), and the preparation table:
regions (graph entries), libraries, refusals, ``fuse`` (the seconds of
AOTInductor compiles, the sum of ``compile_seconds`` of the fused entries),
the preparing and measuring processes' seconds, and the first calls. Below
them every refusal's reason, ltc_cache's warnings and any child's failure.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import fnmatch
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from tools.bench_compile import MODELS as TINY_MODELS
from tools.bench_compile import TRAIN_MODELS as TINY_TRAIN_MODELS
from tools.harness import child_env, ratio, table, tool_argv
from tools.results import Recorder, add_arguments, two_figures

STEADY_MODELS = ("gpt2", "bert", "llama", "t5")  # bench_steady's default --models
GENERATE_MODELS = ("gpt2", "llama")
PROMPT_LENGTH = 8
LABELS = ("eager", "ts", "fused", "inductor")
TITLES = {"eager": "eager", "ts": "TorchScript tier", "fused": "fused", "inductor": "Inductor"}
# LTC_CACHE_FUSE of each ltc_cache variant: the fused one as users run it; its
# libraries are stored, so nothing is queued (``fused_queued`` says otherwise).
FUSE_MODES = {"ts": "off", "fused": "background"}
WARMUP = 3  # calls after the checked one, before timing
COUNTS = ("fused_loads", "fused_refused", "fused_queued", "fused_plan_loads",
          "fused_plan_refused", "fused_plan_queued", "traces", "aot_traces",
          "program_hits", "program_captures", "program_fallbacks", "errors")
CHILD_TIMEOUT = 3600


class Row(NamedTuple):
    group: str  # steady, smallgpt, tiny, suite, generate
    model: str
    mode: str  # infer, train, decode

    @property
    def name(self) -> str:
        return f"{self.group}/{self.model}/{self.mode}"

    @classmethod
    def parse(cls, name: str) -> Row:
        return cls(*name.split("/"))


def all_rows(suite: list[str], modes: list[str]) -> list[Row]:
    rows = [Row("steady", m, "infer") for m in STEADY_MODELS]
    rows.append(Row("smallgpt", "smallgpt", "train"))
    rows += [Row("tiny", m, "infer") for m in TINY_MODELS]
    rows += [Row("tiny", m, "train") for m in TINY_TRAIN_MODELS]
    rows += [Row("suite", m, mode) for m in suite for mode in modes]
    rows += [Row("generate", m, "decode") for m in GENERATE_MODELS]
    return rows


# --- the child processes: the models and their variants ------------------------


def build(row: Row) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """The row's model (seed 0), positional and keyword inputs."""
    import torch

    torch.manual_seed(0)
    if row.group == "steady":
        from zoo.sized_models import build as build_steady

        model, args = build_steady(row.model, "mid")
        return model, args, {}
    if row.group == "smallgpt":
        from zoo.small_gpt import small_gpt

        model, args = small_gpt()
        return model, args, {}
    if row.group == "tiny":
        from zoo.compile_models import MODELS

        model, args = MODELS[row.model]()
        return model, args, {}
    if row.group == "suite":
        from zoo import suite_models

        model, kwargs = suite_models.build(row.model)
        return model, (), kwargs
    if row.group == "generate":
        from zoo.generate_models import build as build_generate
        from zoo.generate_models import prompt

        return build_generate(row.model), (prompt(PROMPT_LENGTH),), {}
    raise SystemExit(f"unknown row {row.name}")


def compiled(label: str, fn: Any) -> Any:
    import torch

    import ltc_cache

    if label == "eager":
        return fn
    if label == "inductor":
        return torch.compile(fn)
    return ltc_cache.compile(fn)


@contextlib.contextmanager
def fuse_mode(mode: str | None) -> Iterator[None]:
    """``LTC_CACHE_FUSE=mode`` (None: as it is) while a variant compiles
    and makes its first calls, where its cache is chosen."""
    kept = os.environ.get("LTC_CACHE_FUSE")
    if mode is not None:
        os.environ["LTC_CACHE_FUSE"] = mode
    try:
        yield
    finally:
        if kept is None:
            os.environ.pop("LTC_CACHE_FUSE", None)
        else:
            os.environ["LTC_CACHE_FUSE"] = kept


class Unit:
    """One variant's unit of work (a call, a step, a request): ``run()``
    does one, ``result()`` one whose outputs are compared with eager's,
    ``time(calls)`` the wall and CPU milliseconds of one, over ``calls``."""

    def __init__(self, run: Callable[[], Any]) -> None:
        self.run = run

    def result(self) -> list[Any]:
        raise NotImplementedError

    def time(self, calls: int) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(calls):
            self.run()
        return ((time.perf_counter() - wall) * 1e3 / calls,
                (time.process_time() - cpu) * 1e3 / calls)


class Infer(Unit):
    def result(self) -> list[Any]:
        from zoo.suite_models import main_output

        return [main_output(self.run()).detach().clone()]


class Train(Unit):
    """A forward, backward and AdamW step of ``model`` called through ``fn``."""

    def __init__(self, fn: Callable[[], Any], model: Any) -> None:
        import torch

        self.fn, self.model = fn, model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        super().__init__(self.step)

    def backward(self) -> Any:
        from zoo.suite_models import loss_of

        self.optimizer.zero_grad(set_to_none=True)
        loss = loss_of(self.fn())
        loss.backward()
        return loss

    def step(self) -> None:
        self.backward()
        self.optimizer.step()

    def result(self) -> list[Any]:
        """The loss and the gradients of a step not taken (no update)."""
        import torch

        loss = self.backward().detach()
        return [loss, *(torch.zeros_like(p) if p.grad is None else p.grad.clone()
                        for p in self.model.parameters())]


class Decode(Unit):
    """One greedy ``generate()`` request; timed per decoded token (between
    the first new token, which the prompt's forward gives, and the last)."""

    def __init__(self, model: Any, prompt: Any, new_tokens: int) -> None:
        from zoo.generate_models import generation_kwargs

        self.model, self.prompt = model, prompt
        self.kwargs = generation_kwargs("static", False, new_tokens)
        super().__init__(lambda: self.request(None))

    def request(self, streamer: Any) -> list[int]:
        return self.model.generate(self.prompt, streamer=streamer, **self.kwargs)[0].tolist()

    def result(self) -> list[Any]:
        return [self.run()]

    def time(self, calls: int) -> tuple[float, float]:
        from transformers.generation.streamers import BaseStreamer

        class Clock(BaseStreamer):
            def __init__(self) -> None:
                self.wall: list[float] = []
                self.cpu: list[float] = []
                self.prompt_seen = False

            def put(self, value: Any) -> None:
                if self.prompt_seen:  # the first put is the prompt
                    self.wall.append(time.perf_counter())
                    self.cpu.append(time.process_time())
                self.prompt_seen = True

            def end(self) -> None:
                pass

        walls, cpus = [], []
        for _ in range(calls):
            clock = Clock()
            self.request(clock)
            steps = len(clock.wall) - 1
            walls.append((clock.wall[-1] - clock.wall[0]) * 1e3 / steps)
            cpus.append((clock.cpu[-1] - clock.cpu[0]) * 1e3 / steps)
        return statistics.mean(walls), statistics.mean(cpus)


def make_unit(row: Row, label: str, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
              new_tokens: int) -> Unit:
    """``label``'s variant of the row, compiled (what compiles runs on its first call)."""
    if row.mode == "decode":
        model.forward = compiled(label, model.forward)
        return Decode(model, args[0], new_tokens)
    model.train(row.mode == "train")
    fn = compiled(label, model)
    if row.mode == "train":
        return Train(lambda: fn(*args, **kwargs), model)
    return Infer(lambda: fn(*args, **kwargs))


def counts() -> dict[str, int]:
    import ltc_cache

    stats = ltc_cache.stats()
    return {k: stats.get(k, 0) for k in COUNTS}


def grad_mode(row: Row) -> Any:
    import torch

    return torch.set_grad_enabled(row.mode == "train")


def set_up(row: Row, label: str, base: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
           new_tokens: int, fuse: str | None = None) -> dict[str, Any]:
    """``label``'s variant, compiled and warm: its unit, the result of its
    second call (the first of a fused region runs TorchScript too and
    returns TorchScript's outputs), the counters its set-up moved, the
    seconds it took, the per-call estimate. ``fuse``: LTC_CACHE_FUSE
    (default: the variant's own)."""
    model = build(row)[0] if row.mode == "decode" else copy.deepcopy(base)
    before, started = counts(), time.perf_counter()
    with fuse_mode(fuse or FUSE_MODES.get(label)), grad_mode(row):
        unit = make_unit(row, label, model, args, kwargs, new_tokens)
        unit.result()
        result = unit.result()
        estimate = min(unit.time(1)[0] for _ in range(WARMUP))
    after = counts()
    return {"unit": unit, "result": result, "seconds": time.perf_counter() - started,
            "estimate_ms": estimate, "counts": {k: after[k] - before[k] for k in COUNTS}}


def difference(got: list[Any], want: list[Any]) -> float:
    """The largest difference, relative to the largest magnitude of
    ``want`` (tokens: the share of the request's tokens that differ)."""
    if not got or not hasattr(got[0], "dtype"):
        tokens = got[0] if got else []
        return sum(a != b for a, b in zip(tokens, want[0], strict=False)) / max(len(want[0]), 1)
    scale = max(float(w.abs().max()) for w in want if w.numel()) or 1.0
    return max(float((g.float() - w.float()).abs().max()) for g, w in zip(got, want, strict=True)
               if w.numel()) / scale


def time_rounds(row: Row, units: dict[str, Unit], calls: dict[str, int],
                rounds: int) -> dict[str, dict[str, float]]:
    """Median wall and CPU ms per unit of each variant over ``rounds``
    rounds, every variant once a round, each round starting one later."""
    labels = list(units)
    samples: dict[str, list[tuple[float, float]]] = {label: [] for label in labels}
    with grad_mode(row):
        for round_ in range(rounds):
            shift = round_ % len(labels)
            for label in labels[shift:] + labels[:shift]:
                samples[label].append(units[label].time(calls[label]))
    return {label: {"wall_ms": statistics.median([w for w, _ in s]),
                    "cpu_ms": statistics.median([c for _, c in s])}
            for label, s in samples.items()}


def stored(kind: str) -> Iterator[Any]:
    """The entries of ``kind`` in the environment's cache directory."""
    import ltc_cache
    from ltc_cache.graph.keys import CacheKey
    from ltc_cache.wire import is_entry_key

    cache = ltc_cache.default_cache()
    store = cache.store
    for key in list(store.keys()) if store is not None else []:
        if not is_entry_key(key):
            continue  # an internal record: lookup_entry would drop it as corrupt
        entry = cache.lookup_entry(CacheKey(key, {}), count=False)
        if entry is not None and entry.kind == kind:
            yield entry


def inventory() -> dict[str, Any]:
    """The cache directory's regions (graph entries) and their fused
    entries: libraries, refusals with their reasons, the compiles' seconds;
    and the plans' graphs (whole-plan libraries: ``plan`` in their items)."""
    from ltc_cache.compile_backend.plan_library import plan_parts

    libraries, refusals = [], []
    plans = {entry.key: len(plan_parts(entry)) for entry in stored("plan")}
    for entry in stored("fused"):
        p = entry.payload
        item = {"graph": entry.graph_name, "graph_key": str(p.get("graph_key", ""))[:12],
                "compile_seconds": float(p.get("compile_seconds") or 0.0),
                "script_ms": p.get("script_ms"), "fused_ms": p.get("fused_ms"),
                "plan": p.get("graph_key") in plans}
        if "library" in p:
            libraries.append(item)
        else:
            refusals.append({**item, "reason": str(p.get("reason", ""))})
    return {"regions": sum(1 for _ in stored("graph")), "plan_graphs": sum(plans.values()),
            "libraries": libraries,
            "refusals": refusals,
            "fuse_seconds": sum(i["compile_seconds"] for i in libraries + refusals)}


def ltc_warnings(caught: list[Any]) -> list[str]:
    seen: list[str] = []
    for w in caught:
        text = str(w.message)
        if any(word in text for word in ("ltc_cache", "fused", "TorchScript", "LTC")) \
                and text not in seen:
            seen.append(text[:600])
    return seen


def child_measure(row: Row, options: dict[str, Any]) -> dict[str, Any]:
    import warnings

    base, args, kwargs = build(row)
    variants, failures = {}, {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for label in LABELS:
            try:
                variants[label] = set_up(row, label, base, args, kwargs, options["new"])
            except Exception:
                failures[label] = traceback.format_exc()
        if "eager" not in variants:
            return {"failures": failures}
        calls = {label: 1 if row.mode == "decode"
                 else max(1, math.ceil(options["round_ms"] / max(v["estimate_ms"], 1e-3)))
                 for label, v in variants.items()}
        times = time_rounds(row, {k: v["unit"] for k, v in variants.items()}, calls,
                            options["rounds"])
    want = variants["eager"]["result"]
    return {
        "times": times, "calls": calls, "failures": failures,
        "errors": {k: difference(v["result"], want) for k, v in variants.items()},
        "set_up_seconds": {k: v["seconds"] for k, v in variants.items()},
        "counts": {k: v["counts"] for k, v in variants.items()},
        "warnings": ltc_warnings(caught), "inventory": inventory(),
    }


def child_cold(row: Row, options: dict[str, Any]) -> dict[str, Any]:
    """The cold process: the fused variant's calls under LTC_CACHE_FUSE=
    ``--prepare`` (``sync``: each region compiled before its first call;
    ``off``: the graphs stored, compiled by :func:`child_fuse` next)."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("ltc_cache.fused").setLevel(logging.INFO)
    base, args, kwargs = build(row)
    fused = set_up(row, "fused", base, args, kwargs, options["new"], fuse=options["prepare"])
    return {"counts": fused["counts"], "inventory": inventory()}


def child_fuse(row: Row, options: dict[str, Any]) -> dict[str, Any]:
    """Every stored region without a fused entry compiled into one, in a
    process of its own, as the background worker (and ``ltc-cache fuse``)
    does: :func:`ltc_cache.graph.fused.tier.fuse_graph`."""
    import logging

    import ltc_cache
    from ltc_cache.compile_backend.plan_library import fuse_stored
    from ltc_cache.graph.fused.tier import fuse_graph

    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("ltc_cache.fused").setLevel(logging.INFO)
    cache = ltc_cache.default_cache()
    for graph in list(stored("graph")):
        fuse_graph(cache, graph.key, graph=graph, timeout=cache.config.fuse_timeout)
    # Then the plans' whole-graph libraries, timed against their regions' libraries.
    for plan in list(stored("plan")):
        fuse_stored(cache, plan.key, timeout=cache.config.fuse_timeout)
    return {"inventory": inventory()}


def child_first(row: Row, label: str, started: float, options: dict[str, Any]) -> dict[str, Any]:
    """A warm process's first call (step, request) of ``label``'s variant."""
    base, args, kwargs = build(row)
    with fuse_mode(FUSE_MODES.get(label)), grad_mode(row):
        unit = make_unit(row, label, base, args, kwargs, options["new"])
        call = time.perf_counter()
        unit.run()
        done = time.time()
    return {"from_start_s": done - started, "first_call_s": time.perf_counter() - call,
            "counts": counts()}


def child(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    if spec["threads"] == "1":
        torch.set_num_threads(1)
    row = Row.parse(spec["row"])
    if spec["task"] == "cold":
        return child_cold(row, spec)
    if spec["task"] == "fuse":
        return child_fuse(row, spec)
    if spec["task"] == "measure":
        return child_measure(row, spec)
    return child_first(row, spec["label"], spec["started"], spec)


# --- the parent: preparing, measuring, reporting ---------------------------------


def row_env(directory: Path, threads: str, cache: Path) -> dict[str, str]:
    """bench_compile's measured environment over ``directory`` (ltc_cache,
    Inductor, the program key), the bytecode cached once for all rows, at
    ``threads``. Every process of a row gets the same TORCHINDUCTOR_*
    variables: they are part of a library's key."""
    env = child_env(directory)
    env["PYTHONPYCACHEPREFIX"] = str(cache / "pycache")
    env.pop("LTC_CACHE_FUSE", None)
    if threads != "1":
        env.pop("OMP_NUM_THREADS", None)
    return env


def run_child(spec: dict[str, Any], env: dict[str, str], log: Path | None = None
              ) -> tuple[dict[str, Any], float]:
    """A child's JSON report (or its failure, the end of its stderr) and its seconds."""
    started = time.perf_counter()
    proc = subprocess.run(tool_argv("bench_fused", "--child", json.dumps(spec)),
                          capture_output=True, text=True, env=env, timeout=CHILD_TIMEOUT)
    seconds = time.perf_counter() - started
    if log is not None:
        log.write_text(proc.stderr)
    if proc.returncode != 0 or not proc.stdout.strip():
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:]) or f"exit {proc.returncode}"
        return {"crash": tail}, seconds
    return json.loads(proc.stdout.strip().splitlines()[-1]), seconds


def prepare(row: Row, threads: str, directory: Path, env: dict[str, str],
            options: dict[str, Any]) -> dict[str, Any]:
    """The row's preparation: read back where an earlier run did it, else
    done now (``prepared.json`` records it) by a cold child under
    ``LTC_CACHE_FUSE=--prepare``, then a child that compiles every region
    left without a fused entry, as the background worker would."""
    marker = directory / "prepared.json"
    if marker.exists():
        return {**json.loads(marker.read_text()), "reused": True}
    directory.mkdir(parents=True, exist_ok=True)
    spec = {**options, "row": row.name, "threads": threads}
    cold, cold_seconds = run_child({**spec, "task": "cold"},
                                   {**env, "LTC_CACHE_FUSE": options["prepare"]},
                                   log=directory / "cold.log")
    result = {"mode": options["prepare"], "cold": cold, "cold_seconds": cold_seconds}
    if "crash" in cold:
        return {**result, "crash": cold["crash"], "reused": False}
    fuse, result["fuse_seconds"] = run_child({**spec, "task": "fuse"}, env,
                                             log=directory / "fuse.log")
    result.update(fuse=fuse, inventory=fuse.get("inventory"))
    if "crash" in fuse:
        return {**result, "crash": fuse["crash"], "reused": False}
    marker.write_text(json.dumps(result))
    return {**result, "reused": False}


def measure_row(row: Row, threads: str, cache: Path, options: dict[str, Any]) -> dict[str, Any]:
    directory = cache / f"t{threads}" / row.name.replace("/", "-")
    if options["reprepare"] and directory.exists():
        shutil.rmtree(directory)
    env = row_env(directory, threads, cache)
    result: dict[str, Any] = {"row": row.name, "threads": threads,
                              "prepare": prepare(row, threads, directory, env, options)}
    if "crash" in result["prepare"]:
        return result
    spec = {**options, "row": row.name, "threads": threads}
    result["measure"], result["measure_seconds"] = run_child({**spec, "task": "measure"}, env)
    if options["first_call"]:
        result["first"] = {}
        for label in ("fused", "ts", "inductor"):
            first, _ = run_child({**spec, "task": "first", "label": label,
                                  "started": time.time()}, env)
            result["first"][label] = first
    return result


# --- the tables -------------------------------------------------------------------


def per_unit(row: str, ms: float | None) -> str:
    if ms is None:
        return "-"
    if row.endswith("/decode"):
        return f"{ms:.2f} ms/token ({1e3 / ms:.0f} tok/s)"
    return f"{ms:.2f} ms"


def libraries_cell(result: dict[str, Any]) -> str:
    measured = result.get("measure", {})
    inv = measured.get("inventory") or result["prepare"].get("inventory") or {}
    fused = measured.get("counts", {}).get("fused", {})
    loads, plan_loads = fused.get("fused_loads"), fused.get("fused_plan_loads", 0)
    libraries = inv.get("libraries", [])
    regions = sum(1 for i in libraries if not i.get("plan"))
    cell = f"{regions} of {inv.get('regions', '?')}"
    if inv.get("plan_graphs"):
        whole = len(libraries) - regions
        cell += f"; whole plans {whole} of {inv['plan_graphs']}, {plan_loads} loaded"
    if loads == 0 and not plan_loads:
        return cell + ", **none loaded**"
    return cell + (f", {loads} loaded" if loads is not None else "")


def clock_of(threads: str, clock: str) -> str:
    return clock if clock != "auto" else "cpu" if threads == "1" else "wall"


def steady_row(result: dict[str, Any], clock: str) -> list[str]:
    name, measured = result["row"], result.get("measure", {})
    if "times" not in measured:
        why = "prepare failed" if "crash" in result["prepare"] else "measure failed"
        return [name, why, *["-"] * (len(STEADY_HEADER) - 2)]
    ms = {k: v[f"{clock}_ms"] for k, v in measured["times"].items()}
    fused = ms.get("fused")
    errors = measured["errors"]
    return [name, *(per_unit(name, ms.get(label)) for label in LABELS),
            f"**{ratio(fused, ms.get('inductor'))}**", ratio(fused, ms.get("ts")),
            ratio(fused, ms.get("eager")), libraries_cell(result),
            ", ".join(f"{errors[k]:.1e}" if k in errors else "-"
                      for k in ("fused", "ts", "inductor"))]


STEADY_HEADER = ["row", "eager", "TorchScript tier", "fused", "Inductor", "fused / Inductor",
                 "fused / TorchScript", "fused / eager", "libraries of regions",
                 "max error (fused, TorchScript, Inductor)"]


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def first_cell(result: dict[str, Any], label: str) -> str:
    first = result.get("first", {}).get(label)
    if first is None:
        return "-"
    if "crash" in first:
        return "crash"
    return f"{first['from_start_s']:.2f} s ({first['first_call_s']:.2f})"


def preparation_row(result: dict[str, Any]) -> list[str]:
    prepared = result["prepare"]
    inv = result.get("measure", {}).get("inventory") or prepared.get("inventory") or {}
    before = prepared.get("inventory") or {}
    late = (len(inv.get("libraries", [])) + len(inv.get("refusals", []))
            - len(before.get("libraries", [])) - len(before.get("refusals", [])))
    earlier = " (earlier run)" if prepared.get("reused") else ""
    return [result["row"], str(inv.get("regions", "-")), str(len(inv.get("libraries", []))),
            str(len(inv.get("refusals", []))) + (f" (+{late} while measuring)" if late else ""),
            seconds(inv.get("fuse_seconds")),
            f"{seconds(prepared.get('cold_seconds'))} ({prepared.get('mode', '-')}){earlier}",
            seconds(prepared.get("fuse_seconds")) + earlier,
            seconds(result.get("measure_seconds")),
            *(first_cell(result, label) for label in ("fused", "ts", "inductor"))]


PREPARATION_HEADER = ["row", "regions", "libraries", "refused", "fuse (compile_seconds)",
                      "cold process (LTC_CACHE_FUSE)", "fusing process", "measuring process",
                      "warm first call, fused: s from process start (call alone)",
                      "TorchScript tier", "Inductor"]


def notes(results: list[dict[str, Any]]) -> list[str]:
    """Refusals, warnings, missing libraries and failures, quoted."""
    lines = []
    for r in results:
        name, measured = r["row"], r.get("measure", {})
        for where, what in (("prepare", r["prepare"]), ("measure", measured),
                            *((f"first call ({k})", v) for k, v in r.get("first", {}).items())):
            if "crash" in what:
                lines.append(f"- {name}: {where} crashed:\n\n```\n{what['crash']}\n```")
        for label, trace in measured.get("failures", {}).items():
            lines.append(f"- {name}: {TITLES[label]} failed:\n\n```\n{trace.strip()}\n```")
        fused = measured.get("counts", {}).get("fused", {})
        if fused and not fused.get("fused_loads") and not fused.get("fused_plan_loads"):
            lines.append(f"- {name}: the fused variant loaded **no library** (fused_loads and "
                         "fused_plan_loads 0)")
        if fused.get("fused_queued"):
            lines.append(f"- {name}: the fused variant queued {fused['fused_queued']} graph(s) "
                         "for the background worker: not all were prepared")
        for refusal in (measured.get("inventory") or {}).get("refusals", []):
            lines.append(f"- {name}: refused {refusal['graph']} ({refusal['graph_key']}, "
                         f"{refusal['compile_seconds']:.1f} s): {refusal['reason']}")
        if fused.get("fused_plan_refused"):
            lines.append(f"- {name}: {fused['fused_plan_refused']} plan library(ies) refused "
                         "on first use")
        if fused.get("fused_refused"):
            lines.append(f"- {name}: {fused['fused_refused']} library(ies) refused on first use")
        lines += [f"- {name}: warning: {w}" for w in measured.get("warnings", [])]
    return lines


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    out = []
    for threads in dict.fromkeys(r["threads"] for r in results):
        mine = [r for r in results if r["threads"] == threads]
        clock = clock_of(threads, args.clock)
        out.append(f"### Fused tier, steady state, {threads} thread(s), {clock} time, "
                   f"median of {args.rounds} rounds (load average {os.getloadavg()[0]:.1f})\n")
        out.append(table([STEADY_HEADER, *(steady_row(r, clock) for r in mine)]))
        out.append(f"\n### Preparation and warm first calls, {threads} thread(s)\n")
        out.append(table([PREPARATION_HEADER, *(preparation_row(r) for r in mine)]))
        lines = notes(mine)
        if lines:
            out.append("\n" + "\n".join(lines))
        out.append("")
    return "\n".join(out)


def _share(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 2)


def results_cells(result: dict[str, Any], clock: str) -> dict[str, Any]:
    """A row's cells as steady_state.json and suite_fused.json hold them
    (milliseconds under the names of its labels)."""
    measured = result.get("measure", {})
    if "times" not in measured:
        why = "prepare failed" if "crash" in result["prepare"] else "measure failed"
        return {**dict.fromkeys(("eager", "torchscript", "fused", "inductor",
                                 "fused_vs_inductor", "fused_vs_torchscript", "fused_vs_eager",
                                 "error_fused", "error_torchscript", "error_inductor")),
                "libraries": why}
    ms = {k: v[f"{clock}_ms"] for k, v in measured["times"].items()}
    errors, fused = measured["errors"], ms.get("fused")
    return {"eager": _round(ms.get("eager")), "torchscript": _round(ms.get("ts")),
            "fused": _round(fused), "inductor": _round(ms.get("inductor")),
            "fused_vs_inductor": _share(fused, ms.get("inductor")),
            "fused_vs_torchscript": _share(fused, ms.get("ts")),
            "fused_vs_eager": _share(fused, ms.get("eager")),
            "libraries": libraries_cell(result),
            **{f"error_{name}": two_figures(errors.get(label)) for label, name in
               (("fused", "fused"), ("ts", "torchscript"), ("inductor", "inductor"))}}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def write_results(recorder: Recorder, results: list[dict[str, Any]], clock: str) -> None:
    """The one-thread rows into their files: suite rows into suite_fused.json's
    ``models``, the others into steady_state.json's ``one_thread``."""
    suite, steady = [], []
    for result in results:
        if result["threads"] != "1":
            continue
        row, cells = Row.parse(result["row"]), results_cells(result, clock)
        if row.group == "suite":
            first = {label: (result.get("first") or {}).get(label) or {}
                     for label in ("fused", "ts", "inductor")}
            suite.append({"model": row.model, "mode": row.mode,
                          **{f"{k}_ms" if k in ("eager", "torchscript", "fused", "inductor")
                             else k: v for k, v in cells.items()},
                          **{f"first_call_{name}_s": _round(first[label].get("first_call_s"))
                             for label, name in (("fused", "fused"), ("ts", "torchscript"),
                                                 ("inductor", "inductor"))}})
        else:
            unit = "ms/token" if row.mode == "decode" else "ms"
            steady.append({"row": row.name, "unit": unit, **cells})
    if suite:
        recorder.write("suite_fused", [{"id": "models", "rows": suite}], threads=1,
                       merge_on={"models": ("model", "mode")})
    if steady:
        recorder.write("steady_state", [{"id": "one_thread", "rows": steady}], threads=1,
                       merge_on={"one_thread": ("row",)})


def selected_rows(args: argparse.Namespace) -> list[Row]:
    patterns = args.rows.split(",")
    suite: list[str] = []
    if any(fnmatch.fnmatch("suite", p.split("/")[0]) for p in patterns):
        from zoo import suite_models

        suite = args.models.split(",") if args.models else suite_models.names()
    return [row for row in all_rows(suite, args.modes.split(","))
            if any(fnmatch.fnmatch(row.name, p) for p in patterns)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_fused",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="*", help="comma-separated fnmatch patterns over "
                        "row names, e.g. 'smallgpt/*,tiny/cnn/infer' (default: all)")
    parser.add_argument("--models", default="", help="the suite's models (default: all)")
    parser.add_argument("--modes", default="infer,train", help="the suite's modes")
    parser.add_argument("--threads", choices=["1", "default", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--round-ms", type=float, default=50.0,
                        help="calls per round: about this many milliseconds of each variant")
    parser.add_argument("--clock", choices=["auto", "wall", "cpu"], default="auto",
                        help="which times the tables show (both are in --json); auto: the "
                        "process's CPU time at one thread (what other jobs disturb least), "
                        "wall time at the default thread count")
    parser.add_argument("--new", type=int, default=32, help="new tokens per generate() request")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/ltc_cache-bench-fused"),
                        help="prepared rows, reused across runs")
    parser.add_argument("--reprepare", action="store_true", help="prepare the rows again")
    parser.add_argument("--prepare", choices=["off", "sync"], default="sync",
                        help="LTC_CACHE_FUSE of the cold preparing process (off: the regions "
                        "are compiled by the fusing process after it)")
    parser.add_argument("--no-first-call", dest="first_call", action="store_false",
                        help="leave out the warm first calls in fresh processes")
    parser.add_argument("--json", type=Path, help="write every result here (after each row)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    add_arguments(parser, "steady_state", "suite_fused")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    recorder = Recorder.from_args("tools.bench_fused", args, argv)
    if recorder and args.threads == "default":
        parser.error("--results writes the one-thread rows: --threads 1 or both")
    rows = selected_rows(args)
    if not rows:
        raise SystemExit(f"no row matches --rows {args.rows}")
    options = {"rounds": args.rounds, "round_ms": args.round_ms, "new": args.new,
               "reprepare": args.reprepare, "first_call": args.first_call,
               "prepare": args.prepare}
    results = []
    for threads in (["1", "default"] if args.threads == "both" else [args.threads]):
        for row in rows:
            started = time.perf_counter()
            results.append(measure_row(row, threads, args.cache.resolve(), options))
            print(f"# {row.name}, {threads} thread(s): {time.perf_counter() - started:.0f} s",
                  file=sys.stderr, flush=True)
            if args.json:
                args.json.write_text(json.dumps(results, indent=1))
    print(report(results, args))
    if recorder:
        write_results(recorder, results, clock_of("1", args.clock))
    return 0


if __name__ == "__main__":
    sys.exit(main())
