"""Time to first result through torch.compile, cold process against warm
process, per model: backend="ltc_cache" beside backend="inductor" with its
own caches on (FX graph cache and AOTAutograd cache), in one run.

    python -m tools.bench.compile [--models gpt2,cnn] [--repeats 3] [--markdown] [--train]
    python -m tools.bench.compile --program [--models gpt2,mlp128] [--repeats 1] [--train]
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
import sys
import tempfile
import time
from pathlib import Path

from tools.bench.compile_child import child, program_child
from tools.harness import (
    add_runs,
    child_env,
    cold_then_warm,
    largest,
    median,
    ratio,
    seconds,
    tool_argv,
)
from tools.results import Recorder, add_arguments, numbers, rounded, two_figures

MODELS = ["gpt2", "bert", "llama", "t5", "transformer_encoder", "cnn"]
TRAIN_MODELS = ["gpt2", "llama", "bert"]
PROGRAM_MODELS = ["gpt2", "bert", "llama", "t5", "transformer_encoder", "mlp128"]
PROGRAM_MODES = ("program", "ltc_cache", "inductor")


def cold_and_warm(model: str, backend: str, scratch: Path, train: bool = False,
                  program: bool = False) -> tuple[dict, dict]:
    """A cold process then a warm one of ``model`` through ``backend`` (with
    ``program``: a mode of --program), over new directories in ``scratch``."""
    env = child_env(Path(tempfile.mkdtemp(prefix=f"{backend}-", dir=scratch)))
    argv = tool_argv("bench.compile", "--child", model, backend,
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
            row["ltc_warm_traces"] = largest(runs["ltc_cache_warm"], "traces")
            row["ltc_warm_aot_traces"] = largest(runs["ltc_cache_warm"], "aot_traces")
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
            row["program_warm_frames"] = largest(warm, "frames")
            row["program_warm_traces"] = largest(warm, "traces")
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
        worst = _worst_error(r)
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


def _worst_error(row: dict) -> float | None:
    """The largest error against eager of any mode's cold or warm run in ``row``."""
    errors = [row.get(f"{m}_{p}_max_error") for m in PROGRAM_MODES for p in ("cold", "warm")]
    return max((e for e in errors if e is not None), default=None)


def _share(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 2)


def results_rows(rows: list[dict]) -> list[dict]:
    """program.json's rows (its ``inference`` or ``training`` table)."""
    out = []
    for r in rows:
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
            "max_error": two_figures(_worst_error(r)),
        })
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.compile",
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
    recorder = Recorder.from_args("tools.bench.compile", options, argv)
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
