"""Inputs of lengths a warm process never met, cold then warm in fresh
processes, side by side: serving ``generate()`` (by default), one forward
call per sequence length (``--forward``), and training on batches of
varying length (``--train``).

    python -m tools.bench.generate [--models gpt2,llama] [--requests 32] [--new 32] [--json]
    python -m tools.bench.generate --forward [--models gpt2,llama]
                                   [--compile program,torch,inductor] [--lengths 5,8,11]
    python -m tools.bench.generate --train [--models gpt2,llama]

``--results`` writes the serving rows into benchmarks/results/generate.json
(a table per model) and, with ``--forward``, the first requests into
lengths.json (one model).

Serving ``generate()``: eager against ltc_cache and Inductor. A worker is
a fresh process that builds a tiny language model
(``zoo/generate_models.py``) in ``eval()``, compiles it, and answers one
greedy request per prompt (transformers' static cache of 256 tokens, 32 new
tokens), then the first prompt four more times to measure steady decoding.
The warm worker's prompts are ``--requests`` lengths drawn from 1-200, none
of which the cold worker met: the cold worker serves one length below each
of ltc_cache's length buckets (so that it meets every bucket, as a fleet
that has served a while has) and ``--requests`` other random lengths. For
each route, on directories of its own, a cold worker (empty caches) then a
warm one (the caches the cold one filled):

- ``eager``: no compiler;
- ``ltc_cache``: ``ltc_cache.compile(model).generate``: each prompt padded
  on the left to its length bucket;
- ``ltc_cache forward``: ``model.forward = ltc_cache.compile(model.forward)``
  (transformers' static-cache recipe): the prompt's forward padded to its
  bucket;
- ``torch backend``: ``model.forward = torch.compile(model.forward,
  backend="ltc_cache")``: the same programs and buckets, Dynamo's frame
  served by them;
- ``inductor``: ``model.forward = torch.compile(model.forward)`` (dynamic
  shapes as Dynamo's default makes them: a static graph, then a symbolic
  length), its FX graph and AOTAutograd caches on.

It reports, per route and start: the time from the worker's process start
to its first generated token; each length's first request (the sum, the
largest, and the warm worker's against Inductor's warm worker's), and the
same for each request's latency to its first token (what compiling adds
to a request, without its 32 tokens of decoding); steady
decoding in tokens per second (between the first and the last new token of
a request, the median of four) with the default number of threads and with
one, and with one thread per second of the process's CPU time (what a
shared machine's other jobs disturb least); the Dynamo captures,
AOTAutograd traces and LTC traces of the warm worker; and how many greedy
answers equal eager's (eager answers the unpadded prompts). The three cold
workers run one after another, then the three warm ones, so that the
routes meet the machine's load alike.

``--forward``: a worker is a fresh process that builds the model
(``zoo/compile_models.py``) in ``eval()``, compiles it
and answers one request (``no_grad``, batch 2) per sequence length, eight
distinct lengths by default; each first request is timed, from the call to
its result. "cold" starts on empty cache directories; "warm" is the next
worker over the same directories and meets the lengths in reverse order.
The compilers, each with its own directories:

- ``program``: ``ltc_cache.compile(model)`` (a program per input layout);
- ``torch``: ``torch.compile(model, backend="ltc_cache")`` (Dynamo's
  automatic dynamic shapes: a static graph, then one with a symbolic
  length, compiled by ltc_cache once per concrete length);
- ``inductor``: ``torch.compile(model)`` with its FX graph and AOTAutograd
  caches on.

It prints, per compiler, the first request of each length (cold, warm,
warm/cold), the totals, and what the warm worker did: AOTAutograd traces,
LTC traces and Dynamo graphs (from ``ltc_cache.stats()``), and the largest
difference from eager over all answers. One intra-op thread.

``--train``: dynamic padding, as transformers' collators pad (each batch to
its longest sequence). A process trains a 2-layer GPT-2 (hidden 64) with
AdamW on 10 batches of four, lengths drawn from 8-64
(``tests/children/lengths.py``); the next process over the same caches draws
10 other lengths (those the first met are drawn again only by chance).
Routes: ``ltc_cache.compile(model)`` (lengths padded to buckets),
``torch.compile(model)`` (Inductor, Dynamo's default dynamic shapes, its
caches on) and eager. It prints, per route and process: the time from the
process's start to its last step's end, the training steps' sum, the
first step, the slowest later step, the warm run against Inductor's warm
run, what the process captured and traced, and the largest difference
of a loss from eager's unpadded one.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tools.bench.generate_lengths import (
    COMPILERS,
    LENGTHS,
    forward_results,
    forward_table,
    forward_worker,
    measure_forward,
    train_table,
)
from tools.harness import child_env, run_child, table, tool_argv
from tools.results import Recorder, add_arguments, rounded

ROUTES = ("eager", "ltc_cache", "ltc_cache forward", "torch backend", "inductor")
STEADY_RUNS = 4
LONGEST = 200  # the longest prompt
CACHE_LEN = 256  # the static cache: the longest prompt, padded, and its new tokens


def prompt_lengths(requests: int, new_tokens: int) -> tuple[list[int], list[int]]:
    """The cold worker's prompt lengths and the warm worker's, which the
    cold one did not meet: one below each bucket a prompt of 1-200 pads to,
    then random lengths for both (fixed seeds)."""
    from ltc_cache.program.buckets import Buckets

    buckets = Buckets()
    room = CACHE_LEN - new_tokens
    below = sorted({buckets.length(n + 1, room) - 1 for n in range(1, LONGEST + 1)})
    draw = random.Random(0)
    cold = below + draw.sample([n for n in range(1, LONGEST + 1) if n not in below], requests)
    warm = draw.sample([n for n in range(1, LONGEST + 1) if n not in cold], requests)
    return cold, warm


def _env(directory: Path) -> dict[str, str]:
    """tools.bench.compile's measured environment, with the default thread count
    (the workers set their own)."""
    env = child_env(directory)
    env.pop("OMP_NUM_THREADS", None)
    return env


# --- the worker ----------------------------------------------------------------


def worker(model_name: str, route: str, lengths: list[int], new_tokens: int,
           started: float) -> dict[str, Any]:
    import warnings

    import torch
    from transformers.generation.streamers import BaseStreamer

    import ltc_cache
    from tools.probes import captures
    from zoo.generate_models import build, generation_kwargs, prompt

    warnings.simplefilter("ignore")

    class Clock(BaseStreamer):
        """When each new token came (the first ``put`` is the prompt)."""

        def __init__(self) -> None:
            self.times: list[float] = []
            self.cpu: list[float] = []  # the process's CPU time, less noisy on a shared machine
            self.prompt_seen = False

        def put(self, value: Any) -> None:
            if self.prompt_seen:
                self.times.append(time.time())
                self.cpu.append(time.process_time())
            self.prompt_seen = True

        def end(self) -> None:
            pass

    model = build(model_name)
    kwargs = generation_kwargs("static", False, new_tokens, CACHE_LEN)
    generate = model.generate
    if route == "ltc_cache":
        generate = ltc_cache.compile(model).generate
    elif route == "ltc_cache forward":
        model.forward = ltc_cache.compile(model.forward)
    elif route == "torch backend":
        model.forward = torch.compile(model.forward, backend="ltc_cache")
    elif route == "inductor":
        model.forward = torch.compile(model.forward)

    def request(n: int) -> tuple[list[int], Clock, float]:
        clock = Clock()
        start = time.time()
        with torch.no_grad():
            tokens = generate(prompt(n), streamer=clock, **kwargs)
        return tokens[0].tolist(), clock, start

    first_token = None
    firsts, ttfts, answers = {}, {}, {}
    for n in lengths:
        tokens, clock, start = request(n)
        first_token = first_token or clock.times[0] - started
        firsts[n] = clock.times[-1] - start
        ttfts[n] = clock.times[0] - start  # the request's latency to its first token
        answers[n] = tokens
    counts = {"captures": captures(), **ltc_cache.stats()}

    def steady() -> tuple[float, float]:
        rates, cpu_rates = [], []
        for _ in range(STEADY_RUNS):
            _, clock, _ = request(lengths[0])
            rates.append((len(clock.times) - 1) / (clock.times[-1] - clock.times[0]))
            cpu_rates.append((len(clock.cpu) - 1) / (clock.cpu[-1] - clock.cpu[0]))
        return statistics.median(rates), statistics.median(cpu_rates)

    default_threads = torch.get_num_threads()
    rate_default, _ = steady()
    torch.set_num_threads(1)
    rate_one, cpu_rate_one = steady()
    return {"first_token": first_token, "firsts": firsts, "ttfts": ttfts, "answers": answers,
            "steady_default": rate_default, "steady_one": rate_one,
            "steady_one_cpu": cpu_rate_one, "threads": default_threads, "counts": counts}


# --- the parent ----------------------------------------------------------------


def run_worker(model: str, route: str, lengths: list[int], new_tokens: int,
               env: dict[str, str]) -> dict[str, Any]:
    started = time.time()
    return run_child(tool_argv("bench.generate", "--worker", model, route,
                               ",".join(map(str, lengths)), str(new_tokens), repr(started)),
                     env, timeout=3600)


def measure(model: str, requests: int, new_tokens: int, scratch: Path) -> dict[str, Any]:
    results: dict[str, Any] = {route: {} for route in ROUTES}
    envs = {route: _env(Path(tempfile.mkdtemp(prefix=f"{model}-{route.replace(' ', '-')}-",
                                              dir=scratch)))
            for route in ROUTES}
    cold, warm = prompt_lengths(requests, new_tokens)
    for start, lengths in (("cold", cold), ("warm", warm)):
        for route in ROUTES:
            results[route][start] = run_worker(model, route, lengths, new_tokens, envs[route])
            print(f"# {model} {route} {start}: done", file=sys.stderr)
    return results


def _same_answers(result: dict[str, Any], eager: dict[str, Any]) -> str:
    if "failed" in result or "failed" in eager:
        return "-"
    same = sum(result["answers"][n] == eager["answers"][n] for n in eager["answers"])
    return f"{same} of {len(eager['answers'])}"


def report(model: str, results: dict[str, Any]) -> str:
    inductor_warm = results["inductor"]["warm"]
    rows = [["route", "start", "process start to first token", "requests (sum)",
             "largest request", "vs Inductor warm (sum)",
             "first tokens (sum)", "largest first token", "vs Inductor warm (first tokens)",
             "steady tok/s (default)",
             "steady tok/s (1 thread)", "steady tok/CPU-s (1 thread)",
             "captures / AOT / LTC traces", "greedy = eager"]]
    for route in ROUTES:
        for start in ("cold", "warm"):
            r = results[route][start]
            if "failed" in r:
                rows.append([route, start, f"failed: {r['failed']}", *["-"] * 11])
                continue
            firsts, ttfts = list(r["firsts"].values()), list(r["ttfts"].values())
            vs = vs_ttft = "-"
            if "failed" not in inductor_warm:
                vs = f"{sum(firsts) / sum(inductor_warm['firsts'].values()):.3f}x"
                vs_ttft = f"{sum(ttfts) / sum(inductor_warm['ttfts'].values()):.3f}x"
            c = r["counts"]
            rows.append([route, start, f"{r['first_token']:.2f} s", f"{sum(firsts):.2f} s",
                         f"{max(firsts):.2f} s", vs, f"{sum(ttfts):.2f} s",
                         f"{max(ttfts):.3f} s", vs_ttft,
                         f"{r['steady_default']:.1f}",
                         f"{r['steady_one']:.1f}", f"{r['steady_one_cpu']:.1f}",
                         f"{c['captures']} / {c.get('aot_traces', 0)} / {c.get('traces', 0)}",
                         _same_answers(r, results["eager"][start])])
    return f"### {model}\n\n" + table(rows)


def serving_rows(results: dict[str, Any]) -> list[dict]:
    """generate.json's rows of one model: a route and start a row."""
    inductor_warm = results["inductor"]["warm"]
    rows = []
    for route in ROUTES:
        for start in ("cold", "warm"):
            r = results[route][start]
            row: dict[str, Any] = {"route": route, "start": start}
            if "failed" in r:
                keys = ("to_first_token_s", "requests_sum_s", "largest_request_s",
                        "requests_vs_inductor", "first_tokens_sum_s", "largest_first_token_s",
                        "first_tokens_vs_inductor", "tok_s_default", "tok_s_one",
                        "tok_cpu_s_one", "warm_counts", "greedy_equal")
                rows.append({**row, **dict.fromkeys(keys)})
                continue
            firsts, ttfts = list(r["firsts"].values()), list(r["ttfts"].values())
            vs = vs_ttft = None
            if "failed" not in inductor_warm:
                vs = round(sum(firsts) / sum(inductor_warm["firsts"].values()), 3)
                vs_ttft = round(sum(ttfts) / sum(inductor_warm["ttfts"].values()), 3)
            c, eager = r["counts"], results["eager"][start]
            same = None if "failed" in eager else [
                sum(r["answers"][n] == eager["answers"][n] for n in eager["answers"]),
                len(eager["answers"])]
            rows.append({**row, "to_first_token_s": rounded(r["first_token"]),
                         "requests_sum_s": rounded(sum(firsts)),
                         "largest_request_s": rounded(max(firsts)),
                         "requests_vs_inductor": vs,
                         "first_tokens_sum_s": rounded(sum(ttfts)),
                         "largest_first_token_s": rounded(max(ttfts), 3),
                         "first_tokens_vs_inductor": vs_ttft,
                         "tok_s_default": rounded(r["steady_default"], 1),
                         "tok_s_one": rounded(r["steady_one"], 1),
                         "tok_cpu_s_one": rounded(r["steady_one_cpu"], 1),
                         "warm_counts": [c["captures"], c.get("aot_traces", 0),
                                         c.get("traces", 0)],
                         "greedy_equal": same})
    return rows


# --- the command line ----------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        model, route, lengths, new_tokens, started = argv[1:6]
        result = worker(model, route, [int(n) for n in lengths.split(",")], int(new_tokens),
                        float(started))
        print(json.dumps(result))
        return 0
    if argv[:1] == ["--forward-worker"]:
        model, compiler, lengths = argv[1:4]
        print(json.dumps(forward_worker(model, compiler, [int(n) for n in lengths.split(",")])))
        return 0
    parser = argparse.ArgumentParser(prog="python -m tools.bench.generate",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt2",
                        help="comma-separated, from zoo/generate_models.py's MODELS (--forward: "
                        "zoo/compile_models.py's; --train: gpt2, llama)")
    section = parser.add_mutually_exclusive_group()
    section.add_argument("--forward", action="store_true",
                         help="one forward call per sequence length instead of generate()")
    section.add_argument("--train", action="store_true",
                         help="training over batches of varying length instead")
    parser.add_argument("--requests", type=int, default=32,
                        help="the warm worker's requests, each a length the cold one did not meet")
    parser.add_argument("--new", type=int, default=32, help="new tokens per request")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--compile", default=",".join(COMPILERS),
                        help="--forward: comma-separated, of " + ", ".join(COMPILERS))
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)),
                        help="--forward: sequence lengths, in the cold worker's order")
    add_arguments(parser, "generate", "lengths")
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    recorder = Recorder.from_args("tools.bench.generate", args, argv)
    if recorder and (args.train or (args.forward and len(models) != 1)):
        parser.error("--results: serving (generate.json) or --forward of one model "
                     "(lengths.json)")
    if args.train:
        print(train_table(models))
        return 0
    if args.forward:
        lengths = [int(n) for n in args.lengths.split(",") if n]
        rows = measure_forward(models, [c for c in args.compile.split(",") if c], lengths)
        print(forward_table(rows, lengths))
        totals = [sum(r["warm"]["first_s"].values()) / sum(r["cold"]["first_s"].values())
                  for r in rows if "failed" not in r["cold"] and "failed" not in r["warm"]]
        if totals:
            print(f"\nmedian total warm/cold over the rows: {statistics.median(totals):.2f}")
        if recorder:
            recorder.write("lengths", [forward_results(rows, lengths)], threads=1)
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-generate-") as scratch:
        measured = {m: measure(m, args.requests, args.new, Path(scratch)) for m in models}
    if recorder:
        threads = {r.get("threads") for m in measured.values() for route in m.values()
                   for r in route.values()} - {None}
        recorder.write("generate", [{"id": m, "rows": serving_rows(results)}
                                    for m, results in measured.items()],
                       threads=f"{max(threads, default='?')} threads (the 1-thread columns: 1)")
    if args.json:
        print(json.dumps(measured))
        return 0
    cold, warm = prompt_lengths(args.requests, args.new)
    print(f"cold prompt lengths {', '.join(map(str, cold))}; warm {', '.join(map(str, warm))}; "
          f"{args.new} new tokens; static cache of {CACHE_LEN}; "
          f"load average {os.getloadavg()[0]:.1f}\n")
    for model, results in measured.items():
        print(report(model, results) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
