"""Time to first result through torch.compile, cold process against warm
process, per model: backend="ltc_cache" beside backend="inductor" with its
own caches on (FX graph cache and AOTAutograd cache), in one run.

    python -m tools.bench_compile [--models gpt2,cnn] [--repeats 3] [--markdown] [--train]
    python -m tools.bench_compile --program [--models gpt2,mlp128] [--repeats 1] [--train]
        [--results]   # its rows into benchmarks/results/program.json

Every measurement is a fresh Python process. "cold" starts with empty cache
directories, "warm" is the next process over the same directories. The time
is from the compiled model's first call to its result (Dynamo's capture
included, imports and model construction not), inference under no_grad, on
one intra-op thread (Inductor compiling in-process:
TORCHINDUCTOR_COMPILE_THREADS=1). backend="eager" (Dynamo's capture, no compiler) is the
floor every torch.compile backend pays. Times are medians over the repeats;
on a shared machine compare the ratios, measured side by side, rather than
the seconds.

``--train`` times training instead (default models gpt2, llama, bert): the
model in ``train()``, one AdamW step from its first call to the end of the
optimizer step (forward and backward compiled), steady steps after it, and
the first loss against eager's.

``--program`` measures the warm start of ``ltc_cache.compile`` (a stored
program: no Dynamo capture) against the warm ``torch.compile(backend=
"ltc_cache")`` and Inductor's warm start, side by side (default models
gpt2, bert, llama, t5, transformer_encoder, mlp128): the time from the
compiled model's first call to its result (capture, loading and compiling
included), inference under no_grad or, with ``--train``, one training step
(forward, backward, AdamW step); the process's peak RSS; and what the warm
program process did (Dynamo captures, LTC traces, programs loaded).

The models are ``zoo/compile_models.py``'s. ``--markdown`` prints the
tables only, else the rows as JSON first.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tools.harness import add_runs, child_env, cold_then_warm, median, ratio, seconds, tool_argv
from tools.results import Recorder, add_arguments, numbers, rounded, two_figures

MODELS = ["gpt2", "bert", "llama", "t5", "transformer_encoder", "cnn"]
TRAIN_MODELS = ["gpt2", "llama", "bert"]
PROGRAM_MODELS = ["gpt2", "bert", "llama", "t5", "transformer_encoder", "mlp128"]
PROGRAM_MODES = ("program", "ltc_cache", "inductor")


def train_child(model_name: str, backend: str) -> dict:
    """One model in train(): the first AdamW step through torch.compile,
    then steady steps, and the same steps in eager on a copy."""
    import copy

    import torch

    from zoo.compile_models import MODELS as BUILDERS
    from zoo.compile_models import loss_of

    torch.manual_seed(0)
    model, args = BUILDERS[model_name]()
    model.train()
    reference = copy.deepcopy(model)

    def step(module, optimizer):
        optimizer.zero_grad()
        loss = loss_of(module(*args))
        loss.backward()
        optimizer.step()
        return loss.item()

    compiled = torch.compile(model, backend=backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cpu = time.process_time()
    start = time.perf_counter()
    got = step(compiled, optimizer)
    first = time.perf_counter() - start
    first_cpu = time.process_time() - cpu
    steady = []
    for _ in range(10):
        start = time.perf_counter()
        step(compiled, optimizer)
        steady.append(time.perf_counter() - start)
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    want = step(reference, reference_optimizer)
    eager = []
    for _ in range(10):
        start = time.perf_counter()
        step(reference, reference_optimizer)
        eager.append(time.perf_counter() - start)
    return {
        "first_s": first,
        "first_cpu_s": first_cpu,
        "steady_ms": statistics.median(steady) * 1e3,
        "eager_ms": statistics.median(eager) * 1e3,
        "max_error": abs(got - want) / abs(want),  # relative, of the first loss
    }


def child(model_name: str, backend: str, train: bool = False) -> None:
    """Build one model, compile it, time its first call and steady calls."""
    import torch

    torch.set_num_threads(1)
    if train:
        report = train_child(model_name, backend)
        _add_ltc_stats(report, backend)
        print(json.dumps(report))
        return
    from zoo.compile_models import MODELS as BUILDERS
    from zoo.compile_models import first_tensor

    torch.manual_seed(0)
    model, args = BUILDERS[model_name]()
    model.eval()
    with torch.no_grad():
        want = first_tensor(model(*args))
        compiled = torch.compile(model, backend=backend)
        cpu = time.process_time()
        start = time.perf_counter()
        got = first_tensor(compiled(*args))
        first = time.perf_counter() - start
        first_cpu = time.process_time() - cpu
        steady = []
        for _ in range(20):
            start = time.perf_counter()
            compiled(*args)
            steady.append(time.perf_counter() - start)
        eager = []
        for _ in range(20):
            start = time.perf_counter()
            model(*args)
            eager.append(time.perf_counter() - start)
    report = {
        "first_s": first,
        "first_cpu_s": first_cpu,
        "steady_ms": statistics.median(steady) * 1e3,
        "eager_ms": statistics.median(eager) * 1e3,
        "max_error": (got - want).abs().max().item(),
    }
    _add_ltc_stats(report, backend)
    print(json.dumps(report))


def _add_ltc_stats(report: dict, backend: str) -> None:
    if backend == "ltc_cache":
        import ltc_cache

        stats = ltc_cache.stats()
        report["traces"] = stats["traces"]
        report["hits"] = stats["hits"]
        report["aot_traces"] = stats.get("aot_traces", 0)
        report["ltc_share"] = stats.get("ltc_ops", 0) / max(stats.get("aten_ops", 0), 1)


def program_child(model_name: str, mode: str, train: bool) -> None:
    """``--program``: one model's first call (or training step) through
    ``ltc_cache.compile`` (``mode`` program) or ``torch.compile`` with
    ``mode`` as its backend, against eager on a copy."""
    import copy

    import torch

    import ltc_cache
    from zoo.compile_models import MODELS as BUILDERS
    from zoo.compile_models import first_tensor, loss_of

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, args = BUILDERS[model_name]()
    model.train(train)
    reference = copy.deepcopy(model)
    compiled = (ltc_cache.compile(model) if mode == "program"
                else torch.compile(model, backend=mode))
    if train:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        start = time.perf_counter()
        optimizer.zero_grad()
        got = loss_of(compiled(*args))
        got.backward()
        optimizer.step()
        first = time.perf_counter() - start
        want = loss_of(reference(*args))
        error = abs(got.item() - want.item()) / max(abs(want.item()), 1e-12)
    else:
        with torch.no_grad():
            start = time.perf_counter()
            got = first_tensor(compiled(*args))
            first = time.perf_counter() - start
            error = (got - first_tensor(reference(*args))).abs().max().item()
    stats = ltc_cache.stats()
    print(json.dumps({
        "first_s": first,
        "max_error": error,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "frames": int(torch._dynamo.utils.counters["frames"]["ok"]),
        "traces": stats["traces"],
        "program_hits": stats.get("program_hits", 0),
        "fallbacks": stats.get("program_fallbacks", 0),
    }))


def cold_and_warm(model: str, backend: str, scratch: Path, train: bool = False,
                  program: bool = False) -> tuple[dict, dict]:
    """A cold process then a warm one of ``model`` through ``backend`` (with
    ``program``: a mode of --program), over new directories in ``scratch``."""
    env = child_env(Path(tempfile.mkdtemp(prefix=f"{backend}-", dir=scratch)))
    argv = tool_argv("bench_compile", "--child", model, backend,
                     *(["--train"] if train else []), *(["--program"] if program else []))
    return cold_then_warm(argv, env)


def measure(models: list[str], repeats: int, train: bool) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-compile-") as scratch:
        for model in models:
            runs: dict[str, list[dict]] = {}
            for _ in range(repeats):
                # Interleaved, so that a slow spell of a shared machine falls
                # on both backends.
                for backend in ("ltc_cache", "inductor"):
                    cold, warm = cold_and_warm(model, backend, Path(scratch), train)
                    runs.setdefault(f"{backend}_cold", []).append(cold)
                    runs.setdefault(f"{backend}_warm", []).append(warm)
                runs.setdefault("dynamo_only", []).append(
                    cold_and_warm(model, "eager", Path(scratch), train)[0])
            row: dict = {"model": model}
            add_runs(row, runs, {"s": "first_s", "cpu_s": "first_cpu_s",
                                 "steady_ms": "steady_ms"})
            row["eager_ms"] = median(runs["ltc_cache_warm"], "eager_ms")
            row["ltc_share"] = median(runs["ltc_cache_warm"], "ltc_share")
            row["ltc_warm_traces"] = max((r.get("traces", 0) for r in runs["ltc_cache_warm"]),
                                         default=None)
            row["ltc_warm_aot_traces"] = max((r.get("aot_traces", 0)
                                              for r in runs["ltc_cache_warm"]), default=None)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "| model | ltc_cache cold | ltc_cache warm | warm/cold | inductor cold | inductor warm "
        "| warm/cold | ltc warm / inductor warm | Dynamo alone | ops in LTC "
        "| ltc warm traces (LTC, AOTAutograd) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {seconds(r['ltc_cache_cold_s'])} | {seconds(r['ltc_cache_warm_s'])} "
            f"| {ratio(r['ltc_cache_warm_s'], r['ltc_cache_cold_s'])} "
            f"| {seconds(r['inductor_cold_s'])} | {seconds(r['inductor_warm_s'])} "
            f"| {ratio(r['inductor_warm_s'], r['inductor_cold_s'])} "
            f"| {ratio(r['ltc_cache_warm_s'], r['inductor_warm_s'])} "
            f"| {seconds(r['dynamo_only_s'])} "
            f"| {'-' if r['ltc_share'] is None else format(r['ltc_share'], '.0%')} "
            f"| {r['ltc_warm_traces']}, {r['ltc_warm_aot_traces']} |")
    lines += [
        "",
        "| model | eager call | ltc_cache steady call | inductor steady call | ltc max error "
        "| inductor max error |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        steady_ltc, steady_ind = r["ltc_cache_warm_steady_ms"], r["inductor_warm_steady_ms"]
        lines.append(
            f"| {r['model']} | {r['eager_ms']:.2f} ms "
            f"| {'-' if steady_ltc is None else format(steady_ltc, '.2f') + ' ms'} "
            f"| {'-' if steady_ind is None else format(steady_ind, '.2f') + ' ms'} "
            f"| {r['ltc_cache_warm_max_error']} | {r['inductor_warm_max_error']} |")
    failures = [(r["model"], k, v) for r in rows for k, v in r.items() if k.endswith("_failed")]
    for model, key, why in failures:
        lines.append(f"\n{model} {key.removesuffix('_failed')}: failed: {why}")
    return "\n".join(lines)


def measure_program(models: list[str], repeats: int, train: bool) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-program-") as scratch:
        for model in models:
            runs: dict[str, list[dict]] = {}
            for _ in range(repeats):
                for mode in PROGRAM_MODES:  # interleaved: a slow spell falls on every mode
                    cold, warm = cold_and_warm(model, mode, Path(scratch), train, program=True)
                    runs.setdefault(f"{mode}_cold", []).append(cold)
                    runs.setdefault(f"{mode}_warm", []).append(warm)
            row: dict = {"model": model, "train": train}
            add_runs(row, runs, {"s": "first_s", "rss_mb": "peak_rss_mb"})
            warm = runs["program_warm"]
            row["program_warm_frames"] = max((r.get("frames", 0) for r in warm), default=None)
            row["program_warm_traces"] = max((r.get("traces", 0) for r in warm), default=None)
            row["program_warm_hits"] = min((r.get("program_hits", 0) for r in warm), default=None)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    return rows


def markdown_program(rows: list[dict]) -> str:
    lines = [
        "| model | program cold | **program warm** | ltc_cache warm | inductor warm "
        "| program warm / inductor warm | program warm / ltc_cache warm "
        "| warm RSS (program / ltc_cache / inductor) | warm: captures, traces, program hits "
        "| max error |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for r in rows:
        rss = " / ".join("-" if r.get(f"{m}_warm_rss_mb") is None
                         else f"{r[f'{m}_warm_rss_mb']:.0f}" for m in PROGRAM_MODES)
        errors = [r.get(f"{m}_{p}_max_error") for m in PROGRAM_MODES for p in ("cold", "warm")]
        worst = max((e for e in errors if e is not None), default=None)
        lines.append(
            f"| {r['model']}{' (train step)' if r['train'] else ''} "
            f"| {seconds(r.get('program_cold_s'))} | **{seconds(r.get('program_warm_s'))}** "
            f"| {seconds(r.get('ltc_cache_warm_s'))} | {seconds(r.get('inductor_warm_s'))} "
            f"| {ratio(r.get('program_warm_s'), r.get('inductor_warm_s'), 'x')} "
            f"| {ratio(r.get('program_warm_s'), r.get('ltc_cache_warm_s'), 'x')} "
            f"| {rss} MB | {r.get('program_warm_frames')}, {r.get('program_warm_traces')}, "
            f"{r.get('program_warm_hits')} "
            f"| {'-' if worst is None else f'{worst:.1e}'} |")
    return "\n".join(lines)


def _share(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 2)


def results_rows(rows: list[dict]) -> list[dict]:
    """program.json's rows (its ``inference`` or ``training`` table)."""
    out = []
    for r in rows:
        errors = [r.get(f"{m}_{p}_max_error") for m in PROGRAM_MODES for p in ("cold", "warm")]
        out.append({
            "model": r["model"], "program_cold_s": rounded(r.get("program_cold_s")),
            "program_warm_s": rounded(r.get("program_warm_s")),
            "torch_compile_warm_s": rounded(r.get("ltc_cache_warm_s")),
            "inductor_warm_s": rounded(r.get("inductor_warm_s")),
            "program_vs_inductor": _share(r.get("program_warm_s"), r.get("inductor_warm_s")),
            "program_vs_torch_compile": _share(r.get("program_warm_s"),
                                               r.get("ltc_cache_warm_s")),
            "warm_rss_mb": numbers([r.get(f"{m}_warm_rss_mb") for m in PROGRAM_MODES]),
            "warm_counts": numbers([r.get("program_warm_frames"), r.get("program_warm_traces"),
                                    r.get("program_warm_hits")]),
            "max_error": two_figures(max((e for e in errors if e is not None), default=None)),
        })
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench_compile",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None, help="comma-separated (default: "
                        + ",".join(MODELS) + "; with --train: " + ",".join(TRAIN_MODELS)
                        + "; with --program: " + ",".join(PROGRAM_MODELS) + ")")
    parser.add_argument("--train", action="store_true", help="time a first training step")
    parser.add_argument("--program", action="store_true",
                        help="ltc_cache.compile's warm start against torch.compile's")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--markdown", action="store_true", help="print the tables only")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "BACKEND"), help=argparse.SUPPRESS)
    add_arguments(parser, "program")
    options = parser.parse_args(argv)
    if options.results and not options.program:
        parser.error("--results writes program.json's rows: with --program")
    if options.child:
        if options.program:
            program_child(*options.child, options.train)
        else:
            child(*options.child, train=options.train)
        return 0
    started = time.time()
    recorder = Recorder.from_args("tools.bench_compile", options, argv)
    default = PROGRAM_MODELS if options.program else TRAIN_MODELS if options.train else MODELS
    models = [m for m in (options.models or ",".join(default)).split(",") if m]
    if options.program:
        rows = measure_program(models, options.repeats, options.train)
        table = markdown_program(rows)
    else:
        rows = measure(models, options.repeats, options.train)
        table = markdown(rows)
    if not options.markdown:
        print(json.dumps(rows, indent=1))
    print(table)
    print(f"({time.time() - started:.0f} s, load average {os.getloadavg()[0]:.1f})",
          file=sys.stderr)
    if recorder:
        # A run of some models refreshes their rows of the table it measured.
        name = "training" if options.train else "inference"
        recorder.write("program", [{"id": name, "rows": results_rows(rows)}], threads=1,
                       merge_on={name: ("model",)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
