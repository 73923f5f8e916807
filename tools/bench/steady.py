"""Steady state through torch.compile at a size where compute counts:
ltc_cache beside eager (and Inductor), per-call times measured in one
process, interleaved, and a profile of where each spends its time.

    python -m tools.bench.steady [--models gpt2,bert,llama,t5] [--size mid]
                                 [--threads 1] [--rounds 15] [--inductor] [--profile]
                                 [--train] [--clock cpu] [--ab CHANGE] [--warm]

``--size mid`` is hidden 256, 4 layers, 4 heads, feed-forward 1024,
sequence 128, batch 2; ``--size tiny`` the configurations of the tests (hidden 32, 2
layers, sequence 8). Inference under ``no_grad`` in ``eval()``, or with
``--train`` a training step in ``train()`` (forward, backward of the mean
square of the first output, AdamW step; each variant on a copy of the model
of its own). Each variant is warmed up, then timed in ``--rounds`` rounds of
``--calls`` calls, the variants one after another in every round (each
round starting one later) so that a slow spell of a shared machine falls on
all alike; ratios are of the medians. Time is process CPU time (``--clock
cpu``: what other jobs on the machine take is not counted, but every thread
of this one is) or wall time.
``--threads 0`` keeps torch's default number of threads. ``smallgpt`` (in
``--models``) is the small GPT (``zoo/small_gpt.py``: 4 layers,
width 128, batch 8 x 64), at its one size whatever ``--size`` says.

``--ab CHANGE`` adds a ltc_cache variant compiled with one change switched
off (``CHANGES``), in a cache directory of its own: the change measured on
its own, side by side.

``--warm`` adds a ltc_cache variant over the first one's cache directory,
compiled after it: it runs from the stored plans, as a warm process does
(a training step through :class:`ltc_cache.compile_backend.joint.JointFunction`, where the
first variant runs AOTAutograd's own runtime wrappers).

``--profile`` adds, per model, the self CPU time per call of each class of
op (``torch.profiler``), eager against ltc_cache, and the LTC regions the
backend cut the graph into: the eager ops between regions are where a
region boundary costs.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from tools.harness import table
from zoo.sized_models import SIZES, build

# Op classes of the profile, first match wins (names as the profiler gives them).
OP_CLASSES = [
    ("attention", r"scaled_dot_product|_flash_attention|_efficient_attention"),
    ("matmul", r"^aten::(addmm|mm|bmm|matmul|linear|baddbmm)$"),
    ("softmax", r"softmax"),
    ("norm", r"layer_norm|rsqrt|^aten::(pow|mean|var)$"),
    ("copy", r"^aten::(copy_|clone|contiguous|_to_copy|to|empty|empty_like|empty_strided)$"),
    ("elementwise", r"^aten::(add|sub|mul|div|neg|gelu|silu|tanh|cos|sin|exp|where|"
                    r"masked_fill|relu|sigmoid|eq|ne|lt|gt|le|ge|cat)_?$"),
    ("index/embedding", r"embedding|index|gather|slice|select|arange"),
    ("view", r"^aten::(view|reshape|_unsafe_view|transpose|permute|t|expand|unsqueeze|"
             r"squeeze|as_strided|split|split_with_sizes|unbind|narrow|alias|detach)$"),
]


def op_class(name: str) -> str:
    for label, pattern in OP_CLASSES:
        if re.search(pattern, name):
            return label
    return "other"


def profile(fn: Callable[[], object], calls: int) -> dict[str, float]:
    """Self CPU ms per call by op class; ``total`` is the wall time per call
    under the profiler, ``untracked`` what no op accounts for (Python, the
    TorchScript interpreter, Dynamo's guards)."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        total = (time.perf_counter() - start) * 1e3 / calls
    by_class: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        if event.key.startswith("aten::") or event.key.startswith("prim::"):
            by_class[op_class(event.key)] += event.self_cpu_time_total / 1e3 / calls
    by_class["untracked"] = total - sum(by_class.values())
    by_class["total"] = total
    return dict(by_class)


class _Regions(logging.Handler):
    """Collects the backend's "N of M aten ops in K LTC regions" lines."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "LTC regions" in message:
            self.lines.append(message)


# --ab NAME: the changes a run can switch off for a variant of its own,
# as (module, function, what runs instead).
CHANGES: dict[str, tuple[str, str, Callable[..., object]]] = {
    "trailing-views": ("ltc_cache.compile_backend.partition", "_leave_out_trailing_views",
                       lambda nodes: None),
    "tanh-gelu": ("ltc_cache.graph.rewrites", "tanh_gelus", lambda graph, inputs: 0),
    "returned-views": ("ltc_cache.graph.rewrites.views", "_returned_views", lambda graph: set()),
    "input-views": ("ltc_cache.compile_backend.partition", "_views_input", lambda node: False),
    "silu-backward": ("ltc_cache.graph.rewrites", "silu_backwards", lambda graph, inputs: 0),
    "read-returned-views": ("ltc_cache.compile_backend.partition", "_read_outside",
                            lambda node, nodes: False),
    "joint-cold": ("ltc_cache.compile_backend.joint_switch", "joint_once_made",
                   lambda aot, made, wrap: aot),
    "tails-to-producers": ("ltc_cache.compile_backend.partition", "_tails_to_their_producers",
                           lambda proposed: proposed),
    "views-at-edges": ("ltc_cache.compile_backend.partition", "_views_apart_at_edges",
                       lambda graph, nodes: None),
}


@contextlib.contextmanager
def without(change: str | None):
    """Run the block with ``change`` switched off (``None``: as the code is)."""
    if change is None:
        yield
        return
    import importlib
    from unittest import mock

    module_name, attribute, instead = CHANGES[change]
    with mock.patch.object(importlib.import_module(module_name), attribute, instead):
        yield


def _ltc_backend(scratch: str):
    """A backend over a cache directory of its own, so that variants share
    no plan or entry."""
    from ltc_cache import CacheConfig, GraphCache, LtcBackend

    return LtcBackend(GraphCache(CacheConfig(directory=Path(scratch))))


def first(result):
    """The first output of a model (logits, or the last hidden state)."""
    return result[0]


def _variants(name: str, args: argparse.Namespace, scratch: str
              ) -> tuple[dict[str, Callable[[], object]], dict[str, str | None], float]:
    """Each variant's call (an inference call, or a training step on a model
    of its own), which change it runs without, and ltc_cache's largest
    difference from eager (outputs, or gradients after one backward)."""
    import copy

    import torch

    model, inputs = build(name, args.size)
    compilers: dict[str, tuple[object, str | None]] = {
        "ltc_cache": (_ltc_backend(f"{scratch}/{name}-ltc"), None)}
    if args.warm:  # ltc_cache's directory again: compiled after it, it finds its plans
        compilers["ltc_cache warm"] = (_ltc_backend(f"{scratch}/{name}-ltc"), None)
    if args.ab:
        compilers[f"without {args.ab}"] = (_ltc_backend(f"{scratch}/{name}-ab"), args.ab)
    if args.inductor:
        compilers["inductor"] = ("inductor", None)
    switched = {"eager": None, **{label: change for label, (_, change) in compilers.items()}}
    if not args.train:
        variants = {"eager": lambda: model(*inputs)}
        for label, (backend, _) in compilers.items():
            variants[label] = functools.partial(torch.compile(model, backend=backend), *inputs)
        with torch.no_grad():
            want = first(model(*inputs))
            error = (first(variants["ltc_cache"]()) - want).abs().max().item()
        return variants, switched, error

    model.train()
    variants, grads = {}, {}
    for label in ["eager", *compilers]:
        copied = copy.deepcopy(model)
        optimizer = torch.optim.AdamW(copied.parameters(), lr=1e-4)
        run = copied if label == "eager" else torch.compile(copied,
                                                            backend=compilers[label][0])

        def step(run=run, optimizer=optimizer) -> None:
            optimizer.zero_grad(set_to_none=True)
            first(run(*inputs)).float().pow(2).mean().backward()
            optimizer.step()

        if label in ("eager", "ltc_cache"):  # gradients of the first step
            first(run(*inputs)).float().pow(2).mean().backward()
            # None where no gradient reached (in eager, BERT's pooler, which
            # the loss does not read; a compiled graph gives zeros, as
            # Inductor's does).
            grads[label] = [torch.zeros_like(p) if p.grad is None else p.grad.clone()
                            for p in copied.parameters()]
            copied.zero_grad(set_to_none=True)
        variants[label] = step
    error = max((a - b).abs().max().item() for a, b in zip(grads["eager"], grads["ltc_cache"],
                                                             strict=True))
    return variants, switched, error


def measure(name: str, args: argparse.Namespace, scratch: str) -> dict:
    import torch

    import ltc_cache

    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    regions = _Regions()
    logging.getLogger("ltc_cache.dynamo").addHandler(regions)
    logging.getLogger("ltc_cache.dynamo").setLevel(logging.INFO)
    torch._dynamo.reset()
    variants, switched, error = _variants(name, args, scratch)
    times: dict[str, list[float]] = {label: [] for label in variants}
    with torch.set_grad_enabled(args.train):
        for label, fn in variants.items():
            with without(switched[label]):  # the first calls compile
                for _ in range(3):
                    fn()
        labels = list(variants)
        for round_ in range(args.rounds):
            # Each variant takes each place in the order equally often: the
            # one after another's garbage runs slower (seen as 5% on tiny graphs).
            shift = round_ % len(labels)
            for label in labels[shift:] + labels[:shift]:
                fn = variants[label]
                start = clock()
                for _ in range(args.calls):
                    fn()
                times[label].append((clock() - start) * 1e3 / args.calls)
        profiles = ({label: profile(variants[label], args.calls) for label in variants}
                    if args.profile else {})
    logging.getLogger("ltc_cache.dynamo").removeHandler(regions)
    stats = ltc_cache.stats()
    return {"model": name, "ms": {k: statistics.median(v) for k, v in times.items()},
            "error": error, "profiles": profiles, "regions": regions.lines,
            "ltc_share": stats.get("ltc_ops", 0) / max(stats.get("aten_ops", 0), 1)}


def report(results: list[dict], args: argparse.Namespace) -> str:
    hidden, layers, _, _, seq, batch = SIZES[args.size]
    threads = args.threads or "default"
    what = "training step (AdamW)" if args.train else "inference"
    clock = "process CPU time" if args.clock == "cpu" else "wall time"
    size = args.size
    if args.models == "smallgpt":  # its one size (zoo/small_gpt.py)
        size, hidden, layers, seq, batch = "small GPT", 128, 4, 64, 8
    out = [f"### Steady state, {size} (hidden {hidden}, {layers} layers, sequence {seq}, "
           f"batch {batch}), {what}, {threads} thread(s), {clock}, median of {args.rounds} "
           f"rounds x {args.calls} calls\n"]
    others = [label for label in results[0]["ms"] if label not in ("eager", "ltc_cache")]
    header = ["model", "eager", "ltc_cache", "ltc / eager"]
    for label in others:
        header += [label, f"ltc / {label}"]
    header += ["max error", "ops in LTC"]
    rows = []
    for r in results:
        ms = r["ms"]
        row = [r["model"], f"{ms['eager']:.2f} ms", f"{ms['ltc_cache']:.2f} ms",
               f"**{ms['ltc_cache'] / ms['eager']:.2f}**"]
        for label in others:
            row += [f"{ms[label]:.2f} ms", f"{ms['ltc_cache'] / ms[label]:.2f}"]
        row += [f"{r['error']:.1e}", f"{r['ltc_share']:.0%}"]
        rows.append(row)
    out.append(table([header, *rows]))
    for r in results:
        if not r["profiles"]:
            continue
        classes = sorted({c for p in r["profiles"].values() for c in p} - {"total"},
                         key=lambda c: -max(p.get(c, 0.0) for p in r["profiles"].values()))
        labels = list(r["profiles"])
        out.append(f"\n{r['model']}: self CPU ms per call by op class (under the profiler)\n")
        out.append(table([["op class", *labels],
                          *([c, *(f"{r['profiles'][lab].get(c, 0.0):.2f}" for lab in labels)]
                            for c in [*classes, "total"])]))
        for line in r["regions"]:
            out.append(f"\n- {line}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.steady",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2,bert,llama,t5")
    parser.add_argument("--size", choices=sorted(SIZES), default="mid")
    parser.add_argument("--threads", type=int, default=1, help="0: torch's default")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--inductor", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--warm", action="store_true",
                        help="add a ltc_cache variant compiled from the plans the first stored "
                             "(what a warm process runs)")
    parser.add_argument("--train", action="store_true",
                        help="time a training step (forward, backward, AdamW) in train()")
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                        help="process CPU time (default; counts every thread) or wall time")
    parser.add_argument("--ab", choices=sorted(CHANGES),
                        help="add a ltc_cache variant with this change switched off")
    args = parser.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-steady-") as scratch:
        results = [measure(name, args, scratch) for name in args.models.split(",")]
    print(report(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
