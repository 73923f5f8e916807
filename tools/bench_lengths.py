"""Serving requests of many sequence lengths: each length's first request in a
cold worker against a warm one, side by side; and (``--train``) training
over batches of varying length.

    python tools/bench_lengths.py [--models gpt2,llama] [--compile program,torch,inductor]
    python tools/bench_lengths.py --train [--models gpt2,llama]

A worker is a fresh process that builds the model in ``eval()``, compiles it
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
(``tests/lengths_child.py``); the next process over the same caches draws
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
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_compile import ROOT, child_env, child_result, ratio, seconds

LENGTHS = (5, 8, 11, 14, 17, 20, 24, 29)
COMPILERS = ("program", "torch", "inductor")


def child(model_name: str, compiler: str, lengths: list[int]) -> None:
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT / "tests"))
    from compile_models import MODELS, VOCAB, first_tensor

    import ltc_cache

    torch.manual_seed(0)
    model, _ = MODELS[model_name]()
    model.eval()
    if compiler == "program":
        compiled = ltc_cache.compile(model)
    elif compiler == "torch":
        compiled = torch.compile(model, backend="ltc_cache")
    else:
        compiled = torch.compile(model)
    firsts, error = {}, 0.0
    with torch.no_grad():
        for length in lengths:
            generator = torch.Generator().manual_seed(length)
            ids = torch.randint(0, VOCAB, (2, length), generator=generator)
            want = first_tensor(model(ids))
            start = time.perf_counter()
            got = first_tensor(compiled(ids))
            firsts[length] = time.perf_counter() - start
            error = max(error, (got - want).abs().max().item())
    stats = ltc_cache.stats()
    print(json.dumps({"first_s": firsts, "max_error": error,
                      "aot_traces": stats.get("aot_traces", 0), "traces": stats["traces"],
                      "dynamo_graphs": stats.get("dynamo_graphs", 0)}))


def worker(model: str, compiler: str, lengths: list[int], env: dict[str, str]) -> dict:
    command = [sys.executable, __file__, "--child", model, compiler,
               "--lengths", ",".join(map(str, lengths))]
    return child_result(subprocess.run(command, capture_output=True, text=True, env=env,
                                       timeout=1800))


def measure(models: list[str], compilers: list[str], lengths: list[int]) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-lengths-") as scratch:
        for model in models:
            for compiler in compilers:
                env = child_env(Path(tempfile.mkdtemp(prefix=f"{compiler}-", dir=scratch)))
                cold = worker(model, compiler, lengths, env)
                warm = worker(model, compiler, lengths[::-1], env)
                rows.append({"model": model, "compiler": compiler, "cold": cold, "warm": warm})
                print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def markdown(rows: list[dict], lengths: list[int]) -> str:
    lines = [
        "| model | compiler | length: cold / warm / warm÷cold ... | total cold | total warm "
        "| total warm/cold | worst warm/cold | warm AOTAutograd traces, LTC traces, "
        "Dynamo graphs | max error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cold, warm = r["cold"], r["warm"]
        if "failed" in cold or "failed" in warm:
            lines.append(f"| {r['model']} | {r['compiler']} | failed: "
                         f"{cold.get('failed') or warm.get('failed')} |")
            continue
        pairs = [(cold["first_s"][str(n)], warm["first_s"][str(n)]) for n in lengths]
        cells = " · ".join(f"{n}: {c:.2f}/{w:.2f}/{w / c:.2f}" for n, (c, w) in
                           zip(lengths, pairs, strict=True))
        total_cold, total_warm = sum(c for c, _ in pairs), sum(w for _, w in pairs)
        worst = max(w / c for c, w in pairs)
        lines.append(
            f"| {r['model']} | {r['compiler']} | {cells} | {seconds(total_cold)} "
            f"| {seconds(total_warm)} | {ratio(total_warm, total_cold)} | {worst:.2f} "
            f"| {warm['aot_traces']}, {warm['traces']}, {warm['dynamo_graphs']} "
            f"| {max(cold['max_error'], warm['max_error']):.1e} |")
    return "\n".join(lines)


TRAIN_ROUTES = ("ltc_cache", "inductor", "eager")


def train_lengths(seed: int) -> list[int]:
    import random

    draw = random.Random(seed)
    return [draw.randint(8, 64) for _ in range(10)]


def train_worker(model: str, route: str, lengths: list[int], env: dict[str, str]) -> dict:
    command = [sys.executable, str(ROOT / "tests" / "lengths_child.py"), "--model", model,
               "--route", route, "--lengths", ",".join(map(str, lengths)),
               "--started", repr(time.time())]
    return child_result(subprocess.run(command, capture_output=True, text=True, env=env,
                                       timeout=1800))


def train_table(models: list[str]) -> str:
    lines = [
        "| model | route | process | process start to last step | steps (sum) | first step "
        "| slowest later step | vs Inductor's warm run | captures / AOT / LTC traces "
        "| loss vs eager |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory(prefix="bench-train-lengths-") as scratch:
        for model in models:
            runs = {}
            for route in TRAIN_ROUTES:
                env = child_env(Path(tempfile.mkdtemp(prefix=f"{route}-", dir=scratch)))
                runs[route] = {start: train_worker(model, route, train_lengths(seed), env)
                               for start, seed in (("cold", 1), ("warm", 2))}
                print(json.dumps({route: runs[route]}), file=sys.stderr)
            inductor = runs["inductor"]["warm"].get("process_s")
            for route, starts in runs.items():
                for start, r in starts.items():
                    if "failed" in r:
                        lines.append(f"| {model} | {route} | {start} | failed: {r['failed']} |")
                        continue
                    s, stats = r["seconds"], r["stats"]
                    captured = r["frames"] + stats.get("program_captures", 0)
                    error = max(abs(a - b) for a, b in zip(r["losses"], r["eager"], strict=True))
                    lines.append(
                        f"| {model} | {route} | {start} | {seconds(r['process_s'])} "
                        f"| {seconds(sum(s))} | {seconds(s[0])} | {seconds(max(s[1:]))} "
                        f"| {ratio(r['process_s'], inductor) if inductor else '-'} "
                        f"| {captured} / {stats.get('aot_traces', 0)} / {stats['traces']} "
                        f"| {error:.1e} |")
    return (f"cold lengths {train_lengths(1)}; warm {train_lengths(2)}\n\n"
            + "\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2", help="comma-separated (default gpt2)")
    parser.add_argument("--compile", default=",".join(COMPILERS),
                        help="comma-separated, of " + ", ".join(COMPILERS))
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)),
                        help="sequence lengths, in the cold worker's order")
    parser.add_argument("--train", action="store_true",
                        help="training over batches of varying length instead")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "COMPILER"), help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.train:
        print(train_table([m for m in options.models.split(",") if m]))
        return
    lengths = [int(n) for n in options.lengths.split(",") if n]
    if options.child:
        child(*options.child, lengths)
        return
    rows = measure([m for m in options.models.split(",") if m],
                   [c for c in options.compile.split(",") if c], lengths)
    print(markdown(rows, lengths))
    totals = [sum(r["warm"]["first_s"].values()) / sum(r["cold"]["first_s"].values())
              for r in rows if "failed" not in r["cold"] and "failed" not in r["warm"]]
    if totals:
        print(f"\nmedian total warm/cold over the rows: {statistics.median(totals):.2f}")


if __name__ == "__main__":
    main()
