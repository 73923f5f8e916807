"""A child process that serves ``generate()`` requests of the tiny language
models of ``zoo/generate_models.py`` through ltc_cache against eager.

``python tests/children/generate.py MODEL --lengths 5,9 [--route forward]
[--cache static] [--then-sample] [--new 16]`` prints one JSON
line: each request's tokens (and eager's, for greedy decoding), its time and
its latency to the first new token (``--then-sample``: a sampled request of
the first length after the greedy ones, in the same process), and the
process's counters (ltc_cache's, Dynamo's captures).
``tests/program/test_generate.py`` runs it in fresh processes, cold then warm.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from tools.probes import captures
from zoo.generate_models import MODELS, build, generation_kwargs, prompt


def compiled(model: torch.nn.Module, route: str) -> Callable[..., Any]:
    """``model.generate`` with the forward compiled the way ``route`` says."""
    import ltc_cache

    if route == "eager":
        return model.generate
    if route == "forward":  # the README's recipe
        model.forward = ltc_cache.compile(model.forward)
        return model.generate
    if route == "torch":
        model.forward = torch.compile(model.forward, backend="ltc_cache")
        return model.generate
    if route == "module":
        return ltc_cache.compile(model).generate
    if route == "inductor":
        model.forward = torch.compile(model.forward)
        return model.generate
    raise SystemExit(f"unknown route {route!r}")


def first_token_clock() -> Any:
    """A streamer that notes when the first new token comes (the first
    ``put`` is the prompt)."""
    from transformers.generation.streamers import BaseStreamer

    class Clock(BaseStreamer):
        def __init__(self) -> None:
            self.puts = 0
            self.first: float | None = None

        def put(self, value: Any) -> None:
            self.puts += 1
            if self.puts == 2:
                self.first = time.perf_counter()

        def end(self) -> None:
            pass

    return Clock()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", choices=MODELS)
    parser.add_argument("--lengths", default="5,9", help="prompt lengths, one request each")
    parser.add_argument("--route", default="forward",
                        choices=("eager", "forward", "torch", "module", "inductor"))
    parser.add_argument("--cache", default="dynamic", choices=("dynamic", "static"))
    parser.add_argument("--then-sample", action="store_true",
                        help="one sampled request after the greedy ones")
    parser.add_argument("--new", type=int, default=8, help="new tokens per request")
    parser.add_argument("--no-check", action="store_true", help="skip eager's tokens")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", UserWarning)  # transformers' config notes

    import ltc_cache
    from ltc_cache.program.buckets import Buckets, pad_generate

    lengths = [int(n) for n in args.lengths.split(",")]
    model = build(args.model)
    kwargs = generation_kwargs(args.cache, False, args.new)
    expected, padded = {}, {}
    if not args.no_check:
        with torch.no_grad():
            for n in lengths:
                expected[n] = model.generate(prompt(n), **kwargs).tolist()
                # What eager makes of the prompt padded as the compiled
                # module's generate() pads it (cut back the same way).
                padded[n] = pad_generate(Buckets(), model, (prompt(n),), dict(kwargs),
                                         model.generate).tolist()
    generate = compiled(model, args.route)
    # (length, generate's arguments, eager's tokens or None)
    runs = [(n, kwargs, expected.get(n)) for n in lengths]
    if args.then_sample:
        runs.append((lengths[0], generation_kwargs(args.cache, True, args.new), None))
    requests, warned = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        for n, request_kwargs, eager in runs:
            torch.manual_seed(n)
            clock = first_token_clock()
            start = time.perf_counter()
            with torch.no_grad():
                tokens = generate(prompt(n), streamer=clock, **request_kwargs).tolist()
            requests.append({"length": n, "seconds": time.perf_counter() - start,
                             "first_token": clock.first - start if clock.first else None,
                             "tokens": tokens, "eager": eager,
                             "eager_padded": padded.get(n) if eager else None})
    warned = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    print(json.dumps({"requests": requests, "stats": ltc_cache.stats(),
                      "captures": captures(), "warnings": warned}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
