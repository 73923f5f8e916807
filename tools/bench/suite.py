"""The models of PyTorch's Dynamo benchmark suites (zoo/suite_models.py)
through ``ltc_cache.compile``, cold then warm in fresh processes.

    python -m tools.bench.suite [--models ResNet,ViT] [--family hf|vision|timm]
                                [--modes train,infer,ckpt,lengths] [--markdown] [--json FILE]
                                [--inductor MODELS] [--repeat N] [--results]

For each model and mode, two fresh processes over one new cache directory:
the cold one, then the warm one. Each builds the model (seed 0), runs one
call (``infer``: under no_grad, in eval(); ``train``: forward, loss, backward
in train() with dropouts 0; ``ckpt``: gradient checkpointing on, as
fine-tuning turns it on, and one optimizer step of 4 micro-batches
accumulated, then AdamW, the call timed being that whole step;
``lengths``: ten AdamW steps on batches of varying length, as dynamic
padding makes them, each batch padded to its longest sequence, the cold
process and the warm one drawing different lengths from 8-64; text models
only) through ``ltc_cache.compile`` and the same in eager on a copy, and
reports: the error against eager (outputs; for training the loss and every
gradient, relative to the largest gradient), the share of aten ops in LTC,
the LTC regions, what the process traced (LTC traces, AOTAutograd traces
counted by wrapping AOTAutograd's own capture functions, and captures:
Dynamo frames, programs captured and calls that fell back from a program
to torch.compile) and the time of the first call. "warm/cold" is the warm
first call over the cold one (``lengths``: the ten steps' sums, and the
warm process's slowest step after its first). One intra-op thread.
The processes write and read their bytecode caches (under the cache
directory), as an installed package's are, even where the environment sets
``PYTHONDONTWRITEBYTECODE``.

``--inductor ResNet,ViT`` (training only: ``train``, or ``ckpt`` where
``--modes`` names it) also runs those models through
``torch.compile`` (Inductor, its FX graph and AOTAutograd caches on, over a
new cache directory of their own, compile workers in-process), cold then
warm, and compares the first warm step of the two: after the cold pairs,
``--repeat`` warm processes of each, alternating (ltc_cache, Inductor,
ltc_cache, ...), medians of the first step's process CPU time and of its
wall time.

``--results`` writes the rows into benchmarks/results/: the suite's into
suite.json (its ``models`` rows of the models and modes run, and the
``summary`` counted again over every row), ``--inductor``'s into
warm_start.json (``suite8``, the models run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.bench.suite_child import child
from tools.harness import bytecode_as_installed, table, tool_argv, with_import_roots
from tools.results import Recorder, add_arguments, numbers, two_figures


def run_child(name: str, mode: str, directory: str, backend: str = "ltc_cache",
              lengths_seed: int = 1) -> dict:
    # LTC_CACHE_FUSE=off: the suite measures starts and what was traced; a
    # background fuse worker would compile beside the next child and write
    # into the temporary directory as it is removed (tools.bench.fused measures
    # the fused tier).
    env = with_import_roots(bytecode_as_installed(
        {**os.environ, "LTC_CACHE_DIR": directory, "OMP_NUM_THREADS": "1",
         "LTC_CACHE_FUSE": "off"}, Path(directory)))
    if backend == "inductor":
        env.update(TORCHINDUCTOR_CACHE_DIR=directory, TORCHINDUCTOR_FX_GRAPH_CACHE="1",
                   TORCHINDUCTOR_AUTOGRAD_CACHE="1", TORCHINDUCTOR_COMPILE_THREADS="1")
    proc = subprocess.run(tool_argv("bench.suite", "--child", name, mode, "--backend", backend,
                                    "--lengths-seed", str(lengths_seed)),
                          capture_output=True, text=True, env=env, timeout=1200)
    if proc.returncode != 0:
        return {"model": name, "mode": mode, "crash": proc.stderr.strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def pair(name: str, mode: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="ltc-suite-") as directory:
        cold = run_child(name, mode, directory)
        # Mode lengths: the warm process meets lengths the cold one drew only by chance.
        warm = run_child(name, mode, directory, lengths_seed=2) if "crash" not in cold else cold
    return {"model": name, "mode": mode, "cold": cold, "warm": warm}


def row(result: dict) -> list[str]:
    cold, warm = result["cold"], result["warm"]
    if "crash" in cold or "crash" in warm:
        crash = (cold.get("crash") or warm.get("crash") or [""])[0]
        return [result["model"], result["mode"], "crash: " + crash[:80], "", "", "", "", ""]
    stats = warm["stats"]
    captures = (warm["frames"] + stats.get("program_captures", 0)
                + stats.get("program_fallbacks", 0))
    share = stats["ltc_ops"] / stats["aten_ops"] if stats.get("aten_ops") else 0.0
    error = max(cold["error"], warm["error"])
    correct = error <= 1e-4 and not cold.get("missing_grads")
    return [result["model"], result["mode"],
            f"{'yes' if correct else 'NO'} ({error:.1e})",
            f"{share:.0%}", str(cold["regions"]),
            f"{stats['traces']}/{warm['aot']}/{captures}",
            _warm_over_cold(cold, warm),
            f"{max(cold.get('buffer_error', 0.0), warm.get('buffer_error', 0.0)):.1e}"]


def _warm_over_cold(cold: dict, warm: dict) -> str:
    """The warm first call over the cold one; mode lengths: the ten steps'
    sums, and the warm process's slowest step after its first."""
    if "seconds" not in warm:
        return f"{warm['first_s'] / cold['first_s']:.2f}"
    later = max(warm["seconds"][1:])
    return f"{sum(warm['seconds']) / sum(cold['seconds']):.2f} (later steps <= {later:.2f} s)"


def against_inductor(name: str, repeat: int, mode: str = "train") -> dict:
    """Training (``mode`` train or ckpt): cold then ``repeat`` warm
    processes of ltc_cache and of Inductor, the warm ones alternating; each
    over a cache of its own."""
    with tempfile.TemporaryDirectory(prefix="ltc-suite-") as ltc, \
            tempfile.TemporaryDirectory(prefix="inductor-suite-") as inductor:
        cold = {"ltc": run_child(name, mode, ltc),
                "inductor": run_child(name, mode, inductor, "inductor")}
        warm: dict[str, list[dict]] = {"ltc": [], "inductor": []}
        for _ in range(repeat):
            warm["ltc"].append(run_child(name, mode, ltc))
            warm["inductor"].append(run_child(name, mode, inductor, "inductor"))
    return {"model": name, "mode": mode, "cold": cold, "warm": warm}


def inductor_row(result: dict) -> list[str]:
    runs = [result["cold"]["ltc"], result["cold"]["inductor"], *result["warm"]["ltc"],
            *result["warm"]["inductor"]]
    crash = next((r["crash"] for r in runs if "crash" in r), None)
    if crash is not None:
        return [result["model"], "crash: " + (crash or [""])[0][:80], "", "", "", "", ""]

    def median(backend: str, field: str) -> float:
        return statistics.median(r[field] for r in result["warm"][backend])

    ratios = [a["first_cpu_s"] / b["first_cpu_s"]
              for a, b in zip(result["warm"]["ltc"], result["warm"]["inductor"], strict=True)]
    error = max(r["error"] for r in result["warm"]["inductor"])
    return [result["model"], f"{median('ltc', 'first_cpu_s'):.2f}",
            f"{median('inductor', 'first_cpu_s'):.2f}",
            f"{median('ltc', 'first_cpu_s') / median('inductor', 'first_cpu_s'):.3f}",
            f"{min(ratios):.3f}-{max(ratios):.3f}",
            f"{median('ltc', 'first_s') / median('inductor', 'first_s'):.3f}",
            f"{result['cold']['inductor']['first_s']:.1f} ({error:.1e})"]


INDUCTOR_HEADER = ["model", "ltc_cache warm first step (CPU s)",
                   "Inductor warm first step (CPU s)", "ltc_cache / Inductor (CPU)",
                   "range of the pairs", "ltc_cache / Inductor (wall)",
                   "Inductor cold first step, s (error)"]

HEADER = ["model", "mode", "correct (error)", "ops in LTC", "regions (cold)",
          "warm traces/AOT/captures", "warm/cold first call (lengths: ten steps)",
          "buffers (error)"]


def results_row(result: dict) -> dict:
    """suite.json's ``models`` row of a pair (cold and warm process)."""
    cold, warm = result["cold"], result["warm"]
    row: dict = {"model": result["model"], "mode": result["mode"]}
    if "crash" in cold or "crash" in warm:
        return {**row, "within_1e-4": False, **dict.fromkeys(
            ("error", "ops_in_ltc", "regions", "warm_counts", "warm_vs_cold", "buffers_error"))}
    stats = warm["stats"]
    captures = (warm["frames"] + stats.get("program_captures", 0)
                + stats.get("program_fallbacks", 0))
    error = max(cold["error"], warm["error"])
    if "seconds" in warm:  # mode lengths: the ten steps' sums
        warm_vs_cold = sum(warm["seconds"]) / sum(cold["seconds"])
    else:
        warm_vs_cold = warm["first_s"] / cold["first_s"]
    return {**row, "within_1e-4": error <= 1e-4 and not cold.get("missing_grads"),
            "error": two_figures(error),
            "ops_in_ltc": round(100 * stats["ltc_ops"] / stats["aten_ops"])
            if stats.get("aten_ops") else 0,
            "regions": cold["regions"], "warm_counts": [stats["traces"], warm["aot"], captures],
            "warm_vs_cold": round(warm_vs_cold, 3),  # the summary's median reads these
            "buffers_error": two_figures(max(cold.get("buffer_error", 0.0),
                                             warm.get("buffer_error", 0.0)))}


def summary_rows(rows: list[dict]) -> list[dict]:
    """suite.json's ``summary``: per mode, over every model's row."""
    out = []
    for mode in dict.fromkeys(r["mode"] for r in rows):
        mine = [r for r in rows if r["mode"] == mode]
        ratios = [r["warm_vs_cold"] for r in mine if r["warm_vs_cold"] is not None]
        out.append({"mode": mode, "models": len(mine),
                    "correct": sum(r["within_1e-4"] is True for r in mine),
                    "warm_zero": sum(r["warm_counts"] == [0, 0, 0] for r in mine),
                    "median_warm_vs_cold": round(statistics.median(ratios), 3)
                    if ratios else None})
    return out


def inductor_results_row(result: dict) -> dict:
    """warm_start.json's ``suite8`` row of a model."""
    runs = [result["cold"]["ltc"], result["cold"]["inductor"], *result["warm"]["ltc"],
            *result["warm"]["inductor"]]
    if any("crash" in r for r in runs):
        return {"model": result["model"], **dict.fromkeys(
            ("ltc_warm_cpu_s", "inductor_warm_cpu_s", "ratio_cpu", "ratio_cpu_range",
             "ratio_wall", "inductor_cold_s", "inductor_error"))}

    def median(backend: str, field: str) -> float:
        return statistics.median(r[field] for r in result["warm"][backend])

    ratios = [a["first_cpu_s"] / b["first_cpu_s"]
              for a, b in zip(result["warm"]["ltc"], result["warm"]["inductor"], strict=True)]
    return {"model": result["model"], "ltc_warm_cpu_s": round(median("ltc", "first_cpu_s"), 2),
            "inductor_warm_cpu_s": round(median("inductor", "first_cpu_s"), 2),
            "ratio_cpu": round(median("ltc", "first_cpu_s")
                               / median("inductor", "first_cpu_s"), 3),
            "ratio_cpu_range": numbers([min(ratios), max(ratios)], 3),
            "ratio_wall": round(median("ltc", "first_s") / median("inductor", "first_s"), 3),
            "inductor_cold_s": round(result["cold"]["inductor"]["first_s"], 1),
            "inductor_error": two_figures(max(r["error"] for r in result["warm"]["inductor"]))}


def write_suite(recorder: Recorder, results: list[dict]) -> None:
    """The pairs' rows into suite.json's ``models``, and its summary counted
    again over every row (the kept ones too)."""
    def summary(doc: dict) -> list[dict]:
        models = next(t for t in doc["tables"] if t["id"] == "models")
        return [{"id": "summary", "rows": summary_rows(models["rows"])}]

    recorder.write("suite", [{"id": "models", "rows": [results_row(r) for r in results]}],
                   threads=1, merge_on={"models": ("model", "mode")}, derive=summary)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.suite",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "MODE"))
    parser.add_argument("--backend", choices=["ltc_cache", "inductor"], default="ltc_cache",
                        help="(with --child) what compiles the model")
    parser.add_argument("--lengths-seed", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--inductor", default="",
                        help="models whose warm first training step is compared with "
                        "Inductor's (instead of the suite table)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="warm processes of each backend for --inductor")
    parser.add_argument("--models", default="")
    parser.add_argument("--family", choices=["hf", "vision", "timm"], default=None)
    parser.add_argument("--modes", default="infer,train")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--json", default=None, help="write every result to this file")
    add_arguments(parser, "suite", "warm_start")
    options = parser.parse_args(argv)
    recorder = None if options.child else Recorder.from_args("tools.bench.suite", options, argv)
    if options.child:
        print(json.dumps(child(*options.child, backend=options.backend,
                               lengths_seed=options.lengths_seed)))
        return 0
    from zoo import suite_models

    if options.inductor:
        compared = []
        mode = "ckpt" if "ckpt" in options.modes.split(",") else "train"
        for name in options.inductor.split(","):
            compared.append(against_inductor(name, options.repeat, mode))
            print(" | ".join(inductor_row(compared[-1])), flush=True)
            if options.json:  # after each model: a long run stopped early keeps its results
                Path(options.json).write_text(json.dumps(compared, indent=1))
        if options.markdown:
            print(table([INDUCTOR_HEADER, *(inductor_row(r) for r in compared)]))
            # The same processes' suite rows (ltc_cache cold, its first warm process).
            print(table([HEADER, *(row({"model": r["model"], "mode": r["mode"],
                                         "cold": r["cold"]["ltc"], "warm": r["warm"]["ltc"][0]})
                                   for r in compared)]))
        if recorder:
            recorder.write("warm_start", [{"id": "suite8", "rows": [
                inductor_results_row(r) for r in compared]}], threads=1,
                merge_on={"suite8": ("model",)})
        return 0

    models = options.models.split(",") if options.models else suite_models.names(options.family)
    results = []
    for name in models:
        for mode in options.modes.split(","):
            result = pair(name, mode)
            results.append(result)
            print(" | ".join(row(result)), flush=True)
            if options.json:  # after each pair: a long run stopped early keeps its results
                Path(options.json).write_text(json.dumps(results, indent=1))
    if options.markdown:
        print(table([HEADER, *(row(r) for r in results)]))
    if recorder:
        write_suite(recorder, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
