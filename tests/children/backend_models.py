"""A child process that runs models of ``zoo/compile_models.py`` through
``torch.compile(backend="ltc_cache")`` against eager, one after the other.

``python tests/children/backend_models.py MODEL [MODEL ...] [--train STEPS]
[--trained MODEL,...]`` prints one JSON line, for each model: the largest
difference from eager, the losses of both (the models of ``--trained``, by
default all, train ``STEPS`` steps), and its counters (this process's, reset
before each model: as a process of its own would count them).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time

import torch
from helpers import ltc_cache_warnings

from zoo.compile_models import MODELS, first_tensor, train

# Ops the backend probed for the models run before (its count is the process's).
_PROBED = [0]


def run(name: str, train_steps: int) -> dict:
    import ltc_cache
    from ltc_cache.diagnostics import counters

    counters.reset()
    torch.manual_seed(0)
    model, args = MODELS[name]()
    model.eval()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="ltc_cache")
    result: dict = {"model": name}

    start = time.perf_counter()
    with torch.no_grad():
        got = first_tensor(compiled(*args))
    result["inference_first_s"] = time.perf_counter() - start
    with torch.no_grad():
        want = first_tensor(reference(*args))
        again = first_tensor(compiled(*args))
    result["inference_max_error"] = max((got - want).abs().max().item(),
                                        (again - want).abs().max().item())
    inference = ltc_cache.stats()
    result["inference_stats"] = inference

    if train_steps:
        model.train()
        reference.train()
        result["eager_losses"] = train(reference, args, train_steps)
        result["losses"] = train(compiled, args, train_steps)
    result["stats"] = ltc_cache.stats()
    probes = ltc_cache.backend.op_support().probes
    result["probes"], _PROBED[0] = probes - _PROBED[0], probes
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("models", nargs="+", choices=sorted(MODELS), metavar="MODEL")
    parser.add_argument("--train", type=int, default=0, metavar="STEPS")
    parser.add_argument("--trained", help="the models that train (default: all)")
    options = parser.parse_args(argv)
    trained = options.trained.split(",") if options.trained else options.models
    results = {}
    for name in options.models:
        with ltc_cache_warnings() as warned:
            result = run(name, options.train if name in trained else 0)
        result["warnings"] = warned
        results[name] = result
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
