"""Serving ``generate()`` on prompts of any length: fresh worker processes,
cold then warm, eager against ltc_cache and Inductor, side by side.

    python tools/bench_generate.py [--models gpt2,llama] [--requests 32] [--new 32] [--json]

A worker is a fresh process that builds a tiny language model
(``tests/generate_child.py``) in ``eval()``, compiles it, and answers one
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
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from bench_compile import child_env  # noqa: E402
from markdown_table import table  # noqa: E402

ROUTES = ("eager", "ltc_cache", "inductor")
STEADY_RUNS = 4
LONGEST = 200  # the longest prompt
CACHE_LEN = 256  # the static cache: the longest prompt, padded, and its new tokens


def prompt_lengths(requests: int, new_tokens: int) -> tuple[list[int], list[int]]:
    """The cold worker's prompt lengths and the warm worker's, which the
    cold one did not meet: one below each bucket a prompt of 1-200 pads to,
    then random lengths for both (fixed seeds)."""
    import random

    from ltc_cache.program.buckets import Buckets

    buckets = Buckets()
    room = CACHE_LEN - new_tokens
    below = sorted({buckets.length(n + 1, room) - 1 for n in range(1, LONGEST + 1)})
    draw = random.Random(0)
    cold = below + draw.sample([n for n in range(1, LONGEST + 1) if n not in below], requests)
    warm = draw.sample([n for n in range(1, LONGEST + 1) if n not in cold], requests)
    return cold, warm


def _env(directory: Path) -> dict[str, str]:
    """bench_compile's measured environment, with the default thread count
    (the workers set their own)."""
    env = child_env(directory)
    env["PYTHONPATH"] = str(ROOT)
    env.pop("OMP_NUM_THREADS", None)
    return env


# --- the worker ----------------------------------------------------------------


def worker(model_name: str, route: str, lengths: list[int], new_tokens: int,
           started: float) -> dict[str, Any]:
    import warnings

    import torch
    from transformers.generation.streamers import BaseStreamer

    sys.path.insert(0, str(ROOT / "tests"))
    from generate_child import build, captures, generation_kwargs, prompt

    import ltc_cache

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
    proc = subprocess.run([sys.executable, __file__, "--worker", model, route,
                           ",".join(map(str, lengths)), str(new_tokens), repr(started)],
                          capture_output=True, text=True, env=env, timeout=3600)
    if proc.returncode != 0:
        return {"failed": (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(model: str, requests: int, new_tokens: int, scratch: Path) -> dict[str, Any]:
    results: dict[str, Any] = {route: {} for route in ROUTES}
    envs = {route: _env(Path(tempfile.mkdtemp(prefix=f"{model}-{route}-", dir=scratch)))
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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        model, route, lengths, new_tokens, started = argv[1:6]
        result = worker(model, route, [int(n) for n in lengths.split(",")], int(new_tokens),
                        float(started))
        print(json.dumps(result))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt2",
                        help="comma-separated, from tests/generate_child.py's MODELS")
    parser.add_argument("--requests", type=int, default=32,
                        help="the warm worker's requests, each a length the cold one did not meet")
    parser.add_argument("--new", type=int, default=32, help="new tokens per request")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-generate-") as scratch:
        measured = {m: measure(m, args.requests, args.new, Path(scratch))
                    for m in args.models.split(",")}
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
