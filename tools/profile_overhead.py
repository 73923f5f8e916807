"""Where a compiled training step's time goes outside the ops, region by
region and per step, for one model of ``tools/bench/steady.py``
(``zoo/sized_models.py``):

    python -m tools.profile_overhead [--model smallgpt] [--size mid] [--reps 50]

The model is compiled with the ``ltc_cache`` backend (a cache directory of
its own) and trained for three AdamW steps, so that its steps run through
the training plan's ``JointFunction`` (a cold process switches to it once
the plan is made). The arguments of each region's last call are kept, and
then, process CPU time per call, one thread, the three measures interleaved
over ``--reps`` repetitions (medians):

- ``call``: the replay callable (``CompiledGraph``), as the parent graph
  calls it: binding the inputs, the TorchScript function, the outputs;
- ``function``: the TorchScript function alone, on the bound inputs.

``call - function`` is the binding of arguments and outputs; ``interpreter
us`` the TorchScript function's own time under ``torch.profiler`` (its self
time: what none of the ops it runs accounts for; wall time, so a loaded
machine inflates it). Per step, eager against ltc_cache, interleaved: the
forward (to the loss), the backward and AdamW's step. Then the backward of
ltc_cache split (process CPU time, ``--reps`` steps): the region calls, the
eager ops between them, the Python of the parent graph around both (the
rest of ``JointFunction``'s backward) and what autograd does outside it
(the loss's backward, the gradients' accumulation).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tools.bench.steady import first
from tools.harness import table
from zoo.sized_models import build


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


def _interpreter_us(graphs: list, last_args: dict, calls: int) -> dict[int, float]:
    """Self time (us per call) of each region's TorchScript function under
    the profiler: the interpreter, apart from the ops it runs."""
    import torch

    names = {}
    with torch.no_grad(), torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for graph in graphs:
            a = last_args.get(id(graph))
            if a is None or graph._fn is None:
                continue
            names[graph._fn.name] = id(graph)
            for _ in range(calls):
                graph(*a)
    return {names[e.key]: e.self_cpu_time_total / calls for e in prof.key_averages()
            if e.key in names}


def _backward_split(step, reps: int) -> dict[str, float]:
    """Process CPU ms per step of the backward's parts (see the docstring)."""
    import torch

    from ltc_cache.compile_backend import joint
    from ltc_cache.graph import replay

    clock, parts = time.process_time, dict.fromkeys(
        ["loss.backward()", "JointFunction backward", "region calls", "eager ops"], 0.0)
    state = {"in_backward": False}
    call, backward = replay.CompiledGraph.__call__, joint._Joint.backward

    def timed_call(self, *a):
        start = clock()
        try:
            return call(self, *a)
        finally:
            if state["in_backward"]:
                parts["region calls"] += clock() - start

    def timed_backward(ctx, *grads):
        state["in_backward"], start = True, clock()
        try:
            return backward(ctx, *grads)
        finally:
            parts["JointFunction backward"] += clock() - start
            state["in_backward"] = False

    eager_ops = [torch.ops.aten.native_layer_norm_backward,
                 torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward]
    kept = [packet.default for packet in eager_ops]

    def timed_op(op):
        def run(*a, **k):
            start = clock()
            try:
                return op(*a, **k)
            finally:
                parts["eager ops"] += clock() - start
        return run

    replay.CompiledGraph.__call__ = timed_call
    joint._Joint.backward = staticmethod(timed_backward)
    for packet, op in zip(eager_ops, kept, strict=True):
        packet.default = timed_op(op)  # what the parent graph's code looks up
    try:
        for _ in range(reps):
            step(parts)
    finally:
        replay.CompiledGraph.__call__ = call
        joint._Joint.backward = staticmethod(backward)
        for packet, op in zip(eager_ops, kept, strict=True):
            packet.default = op
    return {k: v * 1e3 / reps for k, v in parts.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.profile_overhead",
                                     description=__doc__.splitlines()[0])
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
        interpreter = _interpreter_us(graphs, last_args, 5)
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
                             f"{c * 1e3:.0f}", f"{(c - f) * 1e3:.0f}",
                             f"{interpreter.get(id(graph), 0.0):.0f}"])
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

        def split_step(parts: dict[str, float]) -> None:
            optimizer.zero_grad(set_to_none=True)
            loss = first(run(*inputs)).float().pow(2).mean()
            start = time.process_time()
            loss.backward()
            parts["loss.backward()"] += time.process_time() - start
            optimizer.step()

        split = _backward_split(split_step, args.reps)
    print(table([["region", "inputs", "nodes", "call us", "binding us", "interpreter us"], *rows,
                 ["all regions", "", "", f"{totals[0] * 1e3:.0f}",
                  f"{(totals[0] - totals[1]) * 1e3:.0f}",
                  f"{sum(interpreter.values()):.0f}"]]))
    print()
    names = ["forward (to the loss)", "backward", "AdamW step"]
    medians = {k: [statistics.median(p[i] for p in v) for i in range(3)]
               for k, v in phases.items()}
    print(table([["per step, ms", "eager", "ltc_cache", "ltc / eager"],
                 *([name, f"{medians['eager'][i]:.2f}", f"{medians['ltc_cache'][i]:.2f}",
                    f"{medians['ltc_cache'][i] / medians['eager'][i]:.2f}"]
                   for i, name in enumerate(names))]))
    print()
    glue = split["JointFunction backward"] - split["region calls"] - split["eager ops"]
    outside = split["loss.backward()"] - split["JointFunction backward"]
    print(table([["ltc_cache backward, ms per step", ""],
                 ["region calls", f"{split['region calls']:.2f}"],
                 ["eager ops between regions", f"{split['eager ops']:.2f}"],
                 ["Python of the parent graph, JointFunction", f"{glue:.2f}"],
                 ["autograd outside JointFunction", f"{outside:.2f}"],
                 ["loss.backward()", f"{split['loss.backward()']:.2f}"]]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
