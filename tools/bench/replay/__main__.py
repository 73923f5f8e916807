"""Steady-state replay, side by side in one run, as ratios.

    python -m tools.bench.replay                       # every section
    python -m tools.bench.replay --sections steady --models mlp32
    python -m tools.bench.replay --sections wrapper lookup memory
    python -m tools.bench.replay --sections steady --clock cpu  # busy machine

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
import gc
import json
import os
import time
from collections.abc import Callable

import torch

from tools.bench.replay.memory import memory
from tools.bench.replay.overheads import executor, lookup, wrapper
from tools.bench.replay.steady import steady

CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.thread_time}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.replay",
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
