"""Where a compiled training step's time goes outside the ops, region by
region and per step, for one model of ``tools/bench_steady.py``:

    python tools/profile_overhead.py [--model smallgpt] [--size mid] [--reps 50]

The model is compiled with the ``ltc_cache`` backend (a cache directory of
its own) and trained for three AdamW steps, so that its steps run through
the training plan's ``JointFunction`` (a cold process switches to it once
the plan is made). The arguments of each region's last call are kept, and
then, process CPU time per call, one thread, the three measures interleaved
over ``--reps`` repetitions (medians):

- ``call``: the replay callable (``CompiledGraph``), as the parent graph
  calls it: binding the inputs, the TorchScript function, the outputs;
- ``function``: the TorchScript function alone, on the bound inputs.

``call - function`` is the binding of arguments and outputs. Per step, eager
against ltc_cache, interleaved: the forward (to the loss), the backward and
AdamW's step. (The profiler's self CPU times would split the interpreter
from the ops, but they are wall time: on a loaded machine they measure the
load, not the code.)
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from bench_steady import build, first  # noqa: E402
from markdown_table import table  # noqa: E402


def _clock_ms(fn, reps: int) -> float:
    start = time.process_time()
    for _ in range(reps):
        fn()
    return (time.process_time() - start) * 1e3 / reps


def _phases(run, optimizer, inputs) -> tuple[float, float, float]:
    """Process CPU ms of a step's forward (to the loss), backward and
    optimizer step."""
    clock = time.process_time
    start = clock()
    optimizer.zero_grad(set_to_none=True)
    loss = first(run(*inputs)).float().pow(2).mean()
    forward = clock()
    loss.backward()
    backward = clock()
    optimizer.step()
    end = clock()
    return ((forward - start) * 1e3, (backward - forward) * 1e3, (end - backward) * 1e3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smallgpt")
    parser.add_argument("--size", default="mid")
    parser.add_argument("--reps", type=int, default=50)
    args = parser.parse_args(argv)
    import torch

    from ltc_cache import CacheConfig, GraphCache, LtcBackend
    from ltc_cache.graph import replay

    torch.set_num_threads(1)
    graphs: list[replay.CompiledGraph] = []
    last_args: dict[int, tuple] = {}
    init, call = replay.CompiledGraph.__init__, replay.CompiledGraph.__call__

    def kept_init(self, *a, **k):
        init(self, *a, **k)
        graphs.append(self)

    def kept_call(self, *a):
        last_args[id(self)] = a
        return call(self, *a)

    replay.CompiledGraph.__init__ = kept_init
    model, inputs = build(args.model, args.size)
    model.train()
    with tempfile.TemporaryDirectory(prefix="profile-overhead-") as scratch:
        backend = LtcBackend(GraphCache(CacheConfig(directory=Path(scratch))))
        run = torch.compile(copy.deepcopy(model), backend=backend)
        optimizer = torch.optim.AdamW(run.parameters(), lr=1e-4)

        def step() -> None:
            optimizer.zero_grad(set_to_none=True)
            first(run(*inputs)).float().pow(2).mean().backward()
            optimizer.step()

        for _ in range(3):
            step()
        replay.CompiledGraph.__call__ = kept_call
        step()
        replay.CompiledGraph.__call__ = call
        replay.CompiledGraph.__init__ = init
        rows, totals = [], [0.0, 0.0]
        with torch.no_grad():
            for index, graph in enumerate(graphs):
                a = last_args.get(id(graph))
                if a is None or graph._fn is None:
                    continue
                bound = [(graph._bound + a)[i] for i in graph._positions]
                calls, functions = [], []
                for _ in range(5):  # interleaved
                    calls.append(_clock_ms(lambda g=graph, a=a: g(*a), args.reps))
                    functions.append(_clock_ms(lambda g=graph, b=bound: g._fn(*b), args.reps))
                c, f = statistics.median(calls), statistics.median(functions)
                nodes = sum(1 for n in graph._fn.graph.nodes() if n.kind() != "prim::Constant")
                totals = [totals[0] + c, totals[1] + f]
                rows.append([f"r{index}", str(len(graph._positions)), str(nodes),
                             f"{c * 1e3:.0f}", f"{(c - f) * 1e3:.0f}"])
        eager = copy.deepcopy(model)
        eager_optimizer = torch.optim.AdamW(eager.parameters(), lr=1e-4)
        variants = {"eager": (eager, eager_optimizer), "ltc_cache": (run, optimizer)}
        phases: dict[str, list[tuple[float, float, float]]] = {k: [] for k in variants}
        for round_ in range(3 + 16):
            order = list(variants) if round_ % 2 else list(variants)[::-1]
            for label in order:
                timed = _phases(*variants[label], inputs)
                if round_ >= 3:  # the first rounds warm up
                    phases[label].append(timed)
    print(table([["region", "inputs", "nodes", "call us", "binding us"], *rows,
                 ["all regions", "", "", f"{totals[0] * 1e3:.0f}",
                  f"{(totals[0] - totals[1]) * 1e3:.0f}"]]))
    print()
    names = ["forward (to the loss)", "backward", "AdamW step"]
    medians = {k: [statistics.median(p[i] for p in v) for i in range(3)]
               for k, v in phases.items()}
    print(table([["per step, ms", "eager", "ltc_cache", "ltc / eager"],
                 *([name, f"{medians['eager'][i]:.2f}", f"{medians['ltc_cache'][i]:.2f}",
                    f"{medians['ltc_cache'][i] / medians['eager'][i]:.2f}"]
                   for i, name in enumerate(names))]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
