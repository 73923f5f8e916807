"""A child process whose threads call one compiled callable at once, as a
threaded server does (README, "Threads").

``python tests/children/threads.py ROUTE MODEL [--threads 4] [--calls 48]
[--also ROUTE:MODEL ...]`` builds a tiny model (random weights from a fixed
seed, no downloads), compiles it the way ROUTE says, releases the threads together from a
``threading.Barrier`` and has them make ``--calls`` calls in all, each
compared with eager's result. It prints one JSON line: the exceptions the
threads raised, the calls whose result differed from eager's, this
process's counters, the LTC graph keys traced (each should be traced once),
Dynamo's captured frames and ltc_cache's warnings. With ``--also``, more
trials follow in the same process, each counted from a fresh start, and
the line is the list of their reports.

Routes: ``module`` (``ltc_cache.compile(model)``), ``function`` (a function
compiled with ``@ltc_cache.compile``), ``torch`` (``torch.compile(model,
backend="ltc_cache")``, ``--dynamic``: with ``dynamic=True``), ``extract`` (each thread calls
``ltc_cache.extract_compiled_graph`` on the FX graph of the model, then
calls what it returns), ``generate`` (``ltc_cache.compile(model).generate``
with transformers' static cache; MODEL gpt2).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import traceback
import warnings
from collections.abc import Callable
from typing import Any

os.environ.setdefault("LTC_CACHE_FUSE", "off")  # no background g++ in tests

import torch

VOCAB = 96
ROUTES = ("module", "function", "torch", "extract", "generate")
MODELS = ("mlp", "branchy", "bert", "gpt2")


class Branchy(torch.nn.Module):
    """An MLP with a branch on a tensor's value: Dynamo breaks the graph
    there, and ltc_cache.compile stores a program of frames."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        if h.sum() > 0:
            h = h * 2
        return self.fc2(torch.relu(h))


def build(name: str) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """``name``'s tiny model in eval mode, and its input."""
    torch.manual_seed(0)
    if name == "branchy":
        return Branchy().eval(), (torch.randn(2, 16),)
    if name == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 8))
        return model.eval(), (torch.randn(2, 16),)
    import transformers

    ids = torch.randint(3, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    if name == "bert":  # a classifier, as the server ran
        config = transformers.BertConfig(
            num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
            vocab_size=VOCAB, max_position_embeddings=32, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0, num_labels=3)
        return transformers.BertForSequenceClassification(config).eval(), (ids,)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=64, bos_token_id=1,
        eos_token_id=2, pad_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config).eval(), (ids,)


def main_output(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, list | tuple):
        return out[0]
    return out.logits


W1 = torch.randn(16, 32, generator=torch.Generator().manual_seed(2))
W2 = torch.randn(32, 8, generator=torch.Generator().manual_seed(3))


def step(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """The ``function`` route's function."""
    return torch.relu(x @ w1) @ w2


GENERATE = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0,
                cache_implementation="static", max_cache_len=32)


def callables(route: str, model: torch.nn.Module, inputs: tuple[Any, ...],
              threads: int, dynamic: bool) -> tuple[list[Callable[[], Any]], Callable[[], Any]]:
    """One call per thread (what it calls each time) and eager's call."""
    import ltc_cache

    if route == "module":
        compiled = ltc_cache.compile(model)
        return [lambda: compiled(*inputs)] * threads, lambda: model(*inputs)
    if route == "torch":
        # dynamic=True: Dynamo's graph is symbolic, compiled on its first
        # call for each shape (outside Dynamo, on the calling thread).
        compiled = torch.compile(model, backend="ltc_cache", dynamic=dynamic or None)
        return [lambda: compiled(*inputs)] * threads, lambda: model(*inputs)
    if route == "function":
        compiled = ltc_cache.compile(step)
        args = (*inputs, W1, W2)
        return [lambda: compiled(*args)] * threads, lambda: step(*args)
    if route == "extract":
        gm = torch.fx.symbolic_trace(model)

        def extracting() -> Callable[[], Any]:
            made: list[Any] = []

            def call() -> Any:  # extracted on the thread's first call, at once with the others
                if not made:
                    made.append(ltc_cache.extract_compiled_graph(gm, list(inputs)))
                return made[0](*inputs)
            return call
        return [extracting() for _ in range(threads)], lambda: gm(*inputs)
    if route == "generate":
        compiled = ltc_cache.compile(model)
        return ([lambda: compiled.generate(*inputs, **GENERATE)] * threads,
                lambda: model.generate(*inputs, **GENERATE))
    raise SystemExit(f"unknown route {route!r}")


def traced_keys() -> list[str]:
    """The keys of the LTC graphs this process traces, as it traces them."""
    from ltc_cache.graph.cache import GraphCache

    keys: list[str] = []
    original = GraphCache._trace

    def trace(self: Any, model: Any, inputs: Any, name: Any, key: Any, tensors: Any) -> Any:
        keys.append(key.digest if key is not None else "")
        return original(self, model, inputs, name, key, tensors)

    GraphCache._trace = trace  # type: ignore[method-assign]
    return keys


def graphs_unpickled() -> list[str]:
    """The names of the loaded programs whose Dynamo graph this process
    unpickled (a warm start that finds its plan by the program's stored key
    parts needs none)."""
    from ltc_cache.program import program_graph

    unpickled: list[str] = []
    original = program_graph._graph_from

    def counted(stored: Any) -> Any:
        unpickled.append("graph")
        return original(stored)

    program_graph._graph_from = counted
    return unpickled


def trial(route: str, name: str, options: argparse.Namespace, keys: list[str]) -> dict:
    """``name``'s model served through ``route`` on ``options.threads``
    threads at once; the report, counted from a fresh start (ltc_cache's
    counters, Dynamo's frames, the LTC graphs traced)."""
    import ltc_cache
    from ltc_cache.diagnostics import counters

    counters.reset()
    keys.clear()
    if "torch._dynamo" in sys.modules:
        torch._dynamo.utils.counters.clear()
    model, inputs = build(name)
    with torch.no_grad():
        calls, eager = callables(route, model, inputs, options.threads, options.dynamic)
        want = main_output(eager())
    barrier = threading.Barrier(options.threads)
    errors: list[str] = []
    wrong: list[float] = []

    def serve(call: Callable[[], Any]) -> None:
        barrier.wait()
        for _ in range(options.calls // options.threads):
            try:
                with torch.no_grad():
                    got = main_output(call())
                if not torch.equal(got, want):
                    wrong.append(float((got.double() - want.double()).abs().max()))
            except Exception:
                errors.append(traceback.format_exc(limit=8)[-2000:])

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        workers = [threading.Thread(target=serve, args=(call,)) for call in calls]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    report = {
        "errors": errors, "wrong": wrong, "stats": ltc_cache.stats(), "traced": list(keys),
        "frames_ok": int(torch._dynamo.utils.counters["frames"]["ok"])
        if "torch._dynamo" in sys.modules else 0,
        "warnings": [str(w.message) for w in caught if "ltc_cache" in str(w.message)],
    }
    if route == "generate":  # generate() puts the module's own forward back
        report["forward_restored"] = "forward" not in model.__dict__
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("route", choices=ROUTES)
    parser.add_argument("model", choices=MODELS)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--calls", type=int, default=48, help="calls in all, split evenly")
    parser.add_argument("--dynamic", action="store_true", help="torch.compile(dynamic=True)")
    parser.add_argument("--also", action="append", default=[], metavar="ROUTE:MODEL",
                        help="another trial after the first, in this process (repeatable)")
    options = parser.parse_args(argv)
    warnings.simplefilter("ignore", UserWarning)  # transformers' config notes

    keys = traced_keys()
    unpickled = graphs_unpickled()
    trials = [(options.route, options.model)] + [tuple(t.split(":")) for t in options.also]
    reports = [trial(route, name, options, keys) for route, name in trials]
    reports[-1]["graphs_unpickled"] = len(unpickled)  # over the whole process
    print(json.dumps(reports[0] if len(reports) == 1 else reports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
