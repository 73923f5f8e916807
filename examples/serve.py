"""A fleet of serving workers that start warm from the ltc_cache.

    LTC_CACHE_DIR=/tmp/ltc python examples/serve.py --workers 4

Each worker process builds the model, compiles it with
``ltc_cache.compile(model)`` (``--compile torch``: ``torch.compile(model,
backend="ltc_cache")``), answers a warm-up request (the first call is where
the program is captured or loaded and the graphs traced or loaded), then
takes requests from a queue the workers share until it is told to stop.

On a cold cache one worker traces each graph; the others wait on that
graph's lock and load the entry it stored. Run it again and every worker
loads, with no Dynamo capture. With ``LTC_CACHE_REMOTE=redis://host:6379/0``
(and ``LTC_CACHE_SECRET``, which programs from Redis need) set on several
machines, the first machine's traces warm the others too.

``--model lm`` serves generation requests instead: ``generate()`` of a
small GPT-2 on prompts of random lengths (1 to 100 tokens), greedy,
``--new`` tokens, with transformers' static key/value cache at one length
for the fleet, through ``ltc_cache.compile(model).generate``: each prompt
is padded on the left to its length bucket, so a cold fleet captures one
program per bucket it meets and one for decoding, and a warm one captures,
traces and runs AOTAutograd for none of them, whatever lengths come
(``--compile torch``: the forward through ``torch.compile(backend=
"ltc_cache")``, unpadded). ``--serving-threads N`` answers with N threads
in each worker, as a threaded HTTP server would. ``--remote
redis://host:6379/0`` puts a Redis tier under the directory.

It prints, per worker, the start-up time (process start to the first
result), the compile time (first call to first result) and the cache
counters; ``--json`` prints the same as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import sys
import threading
import time
from typing import Any

import torch

import ltc_cache

MODELS = ("gpt2", "mlp", "mlp1", "lm")
# --model lm: prompts of random lengths up to this.
LM_LONGEST = 100
# The static key/value cache's length, the same in every worker and request:
# generate() otherwise sizes it to each request, and each size is a graph.
LM_CACHE_LEN = 128


class TwoStageMLP(torch.nn.Module):
    """Two MLP stacks with a graph break between them: Dynamo hands the
    backend two graphs, as it does for real models with Python it cannot
    capture."""

    def __init__(self, blocks: int = 8, width: int = 256) -> None:
        super().__init__()
        self.first = self._stack(blocks, width)
        self.second = self._stack(blocks, width)

    @staticmethod
    def _stack(blocks: int, width: int) -> torch.nn.Sequential:
        layers: list[torch.nn.Module] = []
        for _ in range(blocks):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.first(x)
        torch._dynamo.graph_break()
        return self.second(x)


def build_model(name: str, longest: int = LM_LONGEST):
    """The model every worker serves: same seed, same weights (a real
    server would load a checkpoint), and the input of a request's seed."""
    torch.manual_seed(0)
    if name in ("mlp", "mlp1"):
        # mlp: two graphs (a graph break); mlp1: one stack, one graph.
        model = TwoStageMLP() if name == "mlp" else TwoStageMLP._stack(8, 256)

        def make_input(seed: int) -> tuple[torch.Tensor, ...]:
            return (torch.randn(8, 256, generator=torch.Generator().manual_seed(seed)),)
        return model.eval(), make_input

    from transformers import GPT2Config, GPT2LMHeadModel

    if name == "lm":  # a small GPT-2 answering generate() requests
        config = GPT2Config(vocab_size=1000, n_positions=LM_CACHE_LEN, n_embd=64, n_layer=2,
                            n_head=4, bos_token_id=1, eos_token_id=2, pad_token_id=0)
        model = GPT2LMHeadModel(config).eval()

        def make_prompt(seed: int) -> tuple[torch.Tensor, ...]:
            gen = torch.Generator().manual_seed(seed)
            length = int(torch.randint(1, longest + 1, (), generator=gen))
            return (torch.randint(3, config.vocab_size, (1, length), generator=gen),)
        return model, make_prompt

    config = GPT2Config(vocab_size=1000, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config).eval()

    def make_input(seed: int) -> tuple[torch.Tensor, ...]:
        gen = torch.Generator().manual_seed(seed)
        return (torch.randint(0, config.vocab_size, (2, 16), generator=gen),)
    return model, make_input


def as_tensor(out: Any):
    """The tensor a request answers with (a transformers output's logits)."""
    return out.logits if hasattr(out, "logits") else out


def generation(model: torch.nn.Module, args: argparse.Namespace):
    """``generate()`` of a request's prompt: greedy, ``args.new`` tokens,
    transformers' static cache at one length for the whole fleet."""
    def answer(ids: torch.Tensor) -> torch.Tensor:
        return model.generate(ids, max_new_tokens=args.new, min_new_tokens=args.new,
                              do_sample=False, cache_implementation="static",
                              max_cache_len=LM_CACHE_LEN)
    return answer


def compiled_model(model: torch.nn.Module, args: argparse.Namespace):
    """The callable a worker serves with. For generation, through the
    compiled module's ``generate()`` (a program per prompt-length bucket and
    one for decoding), or with the forward compiled by ``torch.compile``."""
    if args.model == "lm":
        if args.compile == "ltc_cache":
            return generation(ltc_cache.compile(model), args)
        model.forward = torch.compile(model.forward, backend="ltc_cache")
        return generation(model, args)
    return (ltc_cache.compile(model, dynamic=False) if args.compile == "ltc_cache"
            else torch.compile(model, backend="ltc_cache", dynamic=False))


def worker(wid: int, spawned: float, args: argparse.Namespace,
           requests: mp.Queue, results: mp.Queue) -> None:
    torch.set_num_threads(args.threads)
    imported = time.time()
    model, make_input = build_model(args.model, args.longest)
    compiled = compiled_model(model, args)
    built = time.time()
    with torch.no_grad():
        compiled(*make_input(-1))  # warm-up: traces or loads every graph
    ready = time.time()
    store = ltc_cache.default_cache().store
    results.put(("ready", wid, {
        "startup_s": ready - spawned,
        "import_s": imported - spawned,
        "compile_s": ready - built,
        "stats": ltc_cache.stats(),
        "remote_hits": getattr(store, "remote_hits", 0),
        "frames_captured": int(torch._dynamo.utils.counters["frames"]["ok"]),
        "pid": os.getpid(),
    }))
    served: list[float] = []
    firsts: dict[int, float] = {}

    def answer_requests() -> None:
        while (item := requests.get()) is not None:
            inputs = make_input(item)
            started = time.time()
            with torch.no_grad():
                out = as_tensor(compiled(*inputs))
            took = time.time() - started
            # Each input length's first request: where a program or graph
            # of that length (or its bucket) is loaded or captured.
            firsts.setdefault(int(inputs[0].shape[-1]), took)
            # A plain list: numpy is not needed to run the example.
            results.put(("result", wid, (item, out.tolist())))
            served.append(took)

    threads = [threading.Thread(target=answer_requests) for _ in range(args.serving_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.put(("done", wid, {
        "served": len(served), "stats": ltc_cache.stats(), "firsts": firsts,
        "slowest_request_s": max(served, default=0.0),
        # Dynamo captures: torch.compile's frames and ltc_cache.compile's programs.
        "captures": int(torch._dynamo.utils.counters["frames"]["ok"])
        + ltc_cache.stats().get("program_captures", 0)}))


def serve(args: argparse.Namespace) -> dict[str, Any]:
    ctx = mp.get_context("spawn")  # fresh processes, as a fleet's workers are
    requests, results = ctx.Queue(), ctx.Queue()
    started = time.time()
    procs = [ctx.Process(target=worker, args=(wid, started, args, requests, results),
                         name=f"worker-{wid}") for wid in range(args.workers)]
    for proc in procs:
        proc.start()
    for item in range(args.seed, args.seed + args.requests):
        requests.put(item)
    for _ in range(len(procs) * args.serving_threads):
        requests.put(None)  # one stop for each thread of each worker

    workers: dict[int, dict[str, Any]] = {wid: {} for wid in range(args.workers)}
    answers: dict[int, Any] = {}
    done = 0
    while done < len(procs):
        try:
            kind, wid, payload = results.get(timeout=1.0)
        except queue.Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise SystemExit(f"{dead[0].name} exited with code {dead[0].exitcode}") from None
            continue
        if kind == "ready":
            workers[wid].update(payload)
        elif kind == "result":
            item, out = payload
            answers[item] = out
        else:
            workers[wid]["served"] = payload["served"]
            workers[wid]["final_stats"] = payload["stats"]
            workers[wid]["firsts"] = payload["firsts"]
            workers[wid]["slowest_request_s"] = payload["slowest_request_s"]
            workers[wid]["captures"] = payload["captures"]
            done += 1
    for proc in procs:
        proc.join()
    lengths = sorted({n for w in workers.values() for n in w["firsts"]})
    report: dict[str, Any] = {
        "model": args.model,
        "lengths": lengths,
        "slowest_request_s": max(w["slowest_request_s"] for w in workers.values()),
        "captures": sum(w["captures"] for w in workers.values()),
        "aot_traces": sum(w["final_stats"].get("aot_traces", 0) for w in workers.values()),
        "workers": [workers[wid] | {"worker": wid} for wid in sorted(workers)],
        "requests": len(answers),
        # Graphs Dynamo handed the backend in each worker (the same in all),
        # and the cache lookups they made: a graph LTC lowers whole is one
        # lookup; one that needs partitioning is more (its negative entry,
        # its plan, its regions). On a cold cache a single flight misses each
        # entry in one worker, and the others hit what it stored.
        "graphs": max(w["stats"].get("dynamo_graphs", 0) for w in workers.values()),
        "lookups": max(_graph_lookups(w["stats"]) for w in workers.values()),
        "misses": sum(w["final_stats"]["misses"] for w in workers.values()),
        "traces": sum(w["final_stats"]["traces"] for w in workers.values()),
        "wall_s": time.time() - started,
    }
    if args.check:
        report["max_abs_error"] = check(args, answers)
    return report


def _graph_lookups(stats: dict[str, int]) -> int:
    """Lookups of graph entries: all of them, less those of whole programs."""
    return stats["hits"] + stats["misses"] - stats.get("program_lookups", 0)


def check(args: argparse.Namespace, answers: dict[int, Any]) -> float:
    """The largest difference between a served answer and eager."""
    model, make_input = build_model(args.model, args.longest)
    call = generation(model, args) if args.model == "lm" else model
    worst = 0.0
    with torch.no_grad():
        for item, out in answers.items():
            expected = as_tensor(call(*make_input(item)))
            worst = max(worst, (torch.tensor(out) - expected).abs().max().item())
    return worst


def print_report(report: dict[str, Any]) -> None:
    print(f"{'worker':>6} {'start-up':>9} {'compile':>8} {'served':>6} {'hits':>5} "
          f"{'misses':>6} {'traces':>6} {'remote':>6}")
    for w in report["workers"]:
        s = w["stats"]
        print(f"{w['worker']:>6} {w['startup_s']:>8.2f}s {w['compile_s']:>7.2f}s "
              f"{w['served']:>6} {s['hits']:>5} {s['misses']:>6} {s['traces']:>6} "
              f"{w['remote_hits']:>6}")
    slowest = max(w["startup_s"] for w in report["workers"])
    print(f"{report['model']}: {report['graphs']} graph(s) per worker "
          f"({report['lookups']} cache lookup(s)); in all workers "
          f"{report['misses']} miss(es) and {report['traces']} trace(s); fleet ready in "
          f"{slowest:.2f}s; {report['requests']} requests answered")
    if report["model"] == "lm":
        print(f"{len(report['lengths'])} prompt lengths: slowest request "
              f"{report['slowest_request_s']:.2f}s; in all workers "
              f"{report['captures']} Dynamo capture(s), {report['aot_traces']} AOTAutograd "
              f"trace(s)")
    if "max_abs_error" in report:
        print(f"largest difference from eager: {report['max_abs_error']:.2e}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    parser.add_argument("--requests", type=int, default=32, help="requests to answer")
    parser.add_argument("--model", choices=MODELS, default="gpt2")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads per worker (default: the cores shared out)")
    parser.add_argument("--serving-threads", type=int, default=1,
                        help="threads answering requests in each worker (default 1)")
    parser.add_argument("--check", action="store_true", help="compare answers with eager")
    parser.add_argument("--compile", choices=("ltc_cache", "torch"), default="ltc_cache",
                        help="ltc_cache.compile (default) or torch.compile(backend=ltc_cache)")
    parser.add_argument("--new", type=int, default=16,
                        help="--model lm: new tokens per request (default 16)")
    parser.add_argument("--remote", metavar="URL",
                        help="a Redis tier under the directory (sets LTC_CACHE_REMOTE; "
                        "programs also need LTC_CACHE_SECRET)")
    parser.add_argument("--longest", type=int, default=LM_LONGEST,
                        help=f"--model lm: the longest prompt (default {LM_LONGEST})")
    parser.add_argument("--seed", type=int, default=0,
                        help="the first request's seed (its input; default 0)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.remote:
        os.environ["LTC_CACHE_REMOTE"] = args.remote  # the spawned workers inherit it
    if args.workers < 1 or args.serving_threads < 1:
        parser.error("--workers and --serving-threads must be at least 1")
    if not 1 <= args.longest <= LM_CACHE_LEN - args.new:
        parser.error(f"--longest: 1 to {LM_CACHE_LEN - args.new} (the static cache holds "
                     f"{LM_CACHE_LEN} tokens, prompt and new ones)")
    args.threads = args.threads or max(1, (os.cpu_count() or 1) // args.workers)
    report = serve(args)
    if args.json:
        print(json.dumps(report))
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
