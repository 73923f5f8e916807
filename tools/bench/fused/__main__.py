"""Steady state of the fused tier beside TorchScript replay, eager and Inductor.

Per-call (per-step, per-token) medians of eager, ltc_cache replaying with
TorchScript (``LTC_CACHE_FUSE=off``), ltc_cache with its fused libraries,
and Inductor, side by side in one process, interleaved (A B C D, B C D A,
...), all warm.

    python -m tools.bench.fused [--rows PATTERNS] [--models NAMES] [--modes infer,train]
                                [--threads 1|default|both] [--rounds 15] [--round-ms 50]
                                [--cache DIR] [--reprepare] [--no-first-call]
                                [--prepare off|sync] [--clock auto|wall|cpu] [--new 32]
                                [--json FILE] [--results]

``--results`` writes the rows into benchmarks/results/: the one-thread
suite's into suite_fused.json, the other one-thread rows into
steady_state.json, the default-thread steady rows into steady_threads.json,
each refreshing the rows it measured.

Rows (``--rows``: comma-separated ``fnmatch`` patterns over their names):

- ``steady/{gpt2,bert,llama,t5}/infer``: tools/bench/steady.py's models at
  ``--size mid`` (zoo/sized_models.py: hidden 256, 4 layers, sequence 128,
  batch 2);
- ``smallgpt/smallgpt/train``: the small GPT (zoo/small_gpt.py), one
  forward, backward and AdamW step;
- ``tiny/MODEL/infer`` and ``tiny/MODEL/train``: tools/bench/compile.py's
  tiny models (zoo/compile_models.py), inference for all, a training
  step for its training models;
- ``suite/MODEL/{infer,train}``: the suite's models at tools.bench.suite's tiny
  sizes (zoo/suite_models.py); ``--models`` and ``--modes`` filter them;
- ``generate/{gpt2,llama}/decode``: ``generate()`` with transformers' static
  cache (zoo/generate_models.py, ``model.forward`` compiled as
  tools/bench/generate.py does), ms per decoded token, tokens per second.

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
import fnmatch
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tools.bench.fused.child import child
from tools.bench.fused.report import clock_of, report, write_results
from tools.bench.fused.variants import Row, all_rows
from tools.harness import child_env, tool_argv
from tools.results import Recorder, add_arguments

CHILD_TIMEOUT = 3600


# --- the parent: preparing and measuring -----------------------------------------


def row_env(directory: Path, threads: str, cache: Path) -> dict[str, str]:
    """tools.bench.compile's measured environment over ``directory`` (ltc_cache,
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
    proc = subprocess.run(tool_argv("bench.fused", "--child", json.dumps(spec)),
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


def selected_rows(args: argparse.Namespace) -> list[Row]:
    patterns = args.rows.split(",")
    suite: list[str] = []
    if any(fnmatch.fnmatch("suite", p.split("/")[0]) for p in patterns):
        from zoo import suite_models

        suite = args.models.split(",") if args.models else suite_models.names()
    return [row for row in all_rows(suite, args.modes.split(","))
            if any(fnmatch.fnmatch(row.name, p) for p in patterns)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.fused",
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
    add_arguments(parser, "steady_state", "suite_fused", "steady_threads")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    recorder = Recorder.from_args("tools.bench.fused", args, argv)
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
        write_results(recorder, results, clock_of("1", args.clock),
                      clock_of("default", args.clock))
    return 0


if __name__ == "__main__":
    sys.exit(main())
