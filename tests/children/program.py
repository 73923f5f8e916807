"""A separate process for the ``ltc_cache.compile`` tests: builds a model
from a module the test wrote (``MODELS_DIR/progmodels.py``), runs it through
``ltc_cache.compile`` for each requested call, and checks every result (and,
with --train, every gradient) against eager.

``python tests/children/program.py MODELS_DIR --call 2x16:float32 --call ...``
(MODELS_DIR on its PYTHONPATH: the launching test puts it there) prints
one JSON line: this process's counters, Dynamo's captured frames, the
largest errors, and what ltc_cache.program.precompile logged.

--set SCALE=3.0 rebinds the models module's global ``SCALE`` before the
last call (a guard that must be seen after a program was loaded).

--also="OPTIONS" runs again in the same process with those options (say
``--also="--model broken"``), counted from a fresh start; the line is then the list
of the runs' results.

--watch-loads records each step of a start that rebuilds what was stored
(the program, a plan's graphs, an LTC graph's IR, a program's Dynamo graph
unpickled, its checks compiled), as whether Python's cyclic garbage collector was on at it
(``loads``: step -> list, one item a call).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import shlex
import sys
import warnings


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.name}: {record.getMessage()}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("models_dir")
    parser.add_argument("--model", default="build")
    parser.add_argument("--call", action="append", default=[],
                        help="SHAPE:DTYPE[:grad], e.g. 2x16:float32 (repeatable)")
    parser.add_argument("--train", action="store_true", help="forward and backward")
    parser.add_argument("--set", default=None, help="NAME=FLOAT before the last call")
    parser.add_argument("--decorator", action="store_true",
                        help="compile the module's function `fn` with @ltc_cache.compile")
    parser.add_argument("--watch-loads", action="store_true")
    parser.add_argument("--also", action="append", default=[], metavar="OPTIONS",
                        help="another run after the first, in this process, with these "
                        "options (one string; repeatable)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    options = parser.parse_args(argv)
    runs = [options, *(parser.parse_args([options.models_dir, *shlex.split(more)])
                       for more in options.also)]
    loads: dict[str, list[bool]] = {}
    if any(run.watch_loads for run in runs):
        _watch_loads(loads)

    collect = _Collect()
    for name in ("ltc_cache.precompile", "ltc_cache.program"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        logger.addHandler(collect)

    results = [_run(run, collect, loads) for run in runs]
    print(json.dumps(results[0] if len(results) == 1 else results))
    return 0


def _run(options: argparse.Namespace, collect: _Collect, loads: dict[str, list[bool]]) -> dict:
    """One run of ``options``, counted from a fresh start (ltc_cache's
    counters, Dynamo's frames, the logs, the loads watched): its result."""
    import progmodels
    import torch

    import ltc_cache
    from ltc_cache.diagnostics import counters

    counters.reset()
    if "torch._dynamo" in sys.modules:
        torch._dynamo.utils.counters.clear()
    collect.lines = []
    loads.clear()
    result: dict = {"max_error": 0.0, "grad_error": 0.0, "outputs": []}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if options.decorator:  # progmodels.fn is @ltc_cache.compile'd
            compiled = ltc_cache.compile(progmodels.fn)  # already compiled: itself
            assert compiled is progmodels.fn
            reference = progmodels.fn.__wrapped__
            model = None
        else:
            model = getattr(progmodels, options.model)()
            model.train(options.train)
            eager = copy.deepcopy(model)
            compiled = ltc_cache.compile(model)
            reference = eager
        calls = options.call or ["2x16:float32"]
        for index, spec in enumerate(calls):
            if options.set and index == len(calls) - 1:
                name, value = options.set.split("=")
                setattr(progmodels, name, float(value))
            shape, dtype, *flags = spec.split(":")
            dims = [int(d) for d in shape.split("x")]
            torch.manual_seed(100 + index)
            x = torch.randn(dims, dtype=getattr(torch, dtype))
            if model is not None and model.layers[0].weight.dtype != x.dtype:
                model.to(x.dtype)
                reference.to(x.dtype)
            grad = options.train or "grad" in flags
            with torch.set_grad_enabled(grad):
                got = compiled(x)
                want = reference(x)
            result["max_error"] = max(result["max_error"], (got - want).abs().max().item())
            result["outputs"].append(float(got.double().sum()))
            if options.train:
                got.pow(2).mean().backward()
                want.pow(2).mean().backward()
                errors = [(p.grad - q.grad).abs().max().item() for p, q in
                          zip(model.parameters(), reference.parameters(), strict=True)]
                result["grad_error"] = max(result["grad_error"], *errors)
                model.zero_grad()
                reference.zero_grad()
    if model is not None:
        # The wrapper passes the module through.
        result["same_state"] = list(compiled.state_dict()) == list(model.state_dict())
        result["same_parameters"] = all(a is b for a, b in zip(
            compiled.parameters(), model.parameters(), strict=True))
    result["stats"] = ltc_cache.stats()
    if options.watch_loads:
        import gc

        result["loads"] = {**loads, "after": [gc.isenabled()]}
    result["frames_ok"] = int(torch._dynamo.utils.counters["frames"]["ok"])
    result["logs"] = collect.lines
    result["warnings"] = [str(w.message) for w in caught if "ltc_cache" in str(w.message)]
    return result


def _watch_loads(seen: dict[str, list[bool]]) -> None:
    import gc

    from torch._dynamo.aot_compile import AOTCompiledFunction

    from ltc_cache.compile_backend import joint, plan
    from ltc_cache.graph import cache
    from ltc_cache.program import check_exprs, program_graph

    def watched(owner, name, label):
        original = getattr(owner, name)

        def run(*args, **kwargs):
            seen.setdefault(label, []).append(gc.isenabled())
            return original(*args, **kwargs)

        setattr(owner, name, run)

    watched(AOTCompiledFunction, "__post_init__", "program")  # builds the guard manager
    watched(joint, "partitioned_from_wire", "plan")
    watched(plan, "partitioned_from_wire", "plan")
    watched(cache, "build_function", "ir")
    watched(program_graph, "_graph_from", "dynamo_graph")
    watched(check_exprs, "_compile", "checks_compile")


if __name__ == "__main__":
    sys.exit(main())
