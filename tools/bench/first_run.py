"""A user's first and second run: a ``train.py`` (tools/bench/first_run_child.py,
the small GPT or GPT-2 small's shape) run as a user runs it, in fresh
processes at torch's default thread count, eager, through Inductor cold
then warm, and through ``ltc_cache.compile`` cold with the fused tier off,
cold with the defaults, then warm. Times are from each process's start.

    python -m tools.bench.first_run [--model small-gpt|gpt2-small] [--steps 40]
        [--variants eager,inductor,ltc-off,ltc] [--plot benchmarks/first_run.png] [--results]
        [--keep DIR]

Per run: the first iteration's end, the median and the worst of the later
iterations; for ltc_cache's default cold run, when its fused libraries
were ready (the background worker done, seconds from that process's start)
and how many it compiled and refused; its later steps against the run with
the fused tier off, side by side. ``--plot`` draws each cold run's step
times against the time since its start.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools.harness import with_import_roots
from tools.results import Recorder, add_arguments

COLUMNS = [
    {"key": "model", "label": "model"}, {"key": "run", "label": "run"},
    {"key": "first_s", "label": "first iteration", "format": ".2f", "suffix": " s"},
    {"key": "median_ms", "label": "later: median", "format": ".1f", "suffix": " ms"},
    {"key": "worst_ms", "label": "later: worst", "format": ".1f", "suffix": " ms"},
    {"key": "vs_off", "label": "median / fused tier off", "format": ".2f", "suffix": "x"},
    {"key": "libraries", "label": "libraries ready (from the start)"},
]
DESCRIBE = {
    "title": "A user's first and second run",
    "question": "Does a first run with the defaults step as fast as one without the fused "
                "tier, and when are its libraries ready against Inductor's compile?",
    "method": "`tools/bench/first_run_child.py` (a train.py: the small GPT, or GPT-2 small's "
              "shape, AdamW) in fresh processes at torch's default thread count; times from each "
              "process's start; later iterations are those after the first. Each kind of run "
              "starts on a fresh machine: cache directories and a temporary directory (where "
              "Inductor keeps its precompiled headers) of its own.",
}

CHILD = [sys.executable, "-m", "tools.bench.first_run_child"]


def _env(directory: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LTC_CACHE_", "TORCHINDUCTOR_", "OMP_NUM_THREADS"))}
    # Inductor keeps its precompiled headers in the temporary directory,
    # whatever TORCHINDUCTOR_CACHE_DIR says: a machine's first run builds them.
    (directory / "tmp").mkdir(parents=True, exist_ok=True)
    env.update({"TMPDIR": str(directory / "tmp"), "LTC_CACHE_DIR": str(directory / "ltc"),
                "XDG_CONFIG_HOME": str(directory / "config"),
                "TORCHINDUCTOR_CACHE_DIR": str(directory / "inductor"), **extra})
    return with_import_roots(env)


def run(compile_with: str, model: str, steps: int, env: dict[str, str]) -> dict:
    """One process: its iterations' ends (seconds since its start) and losses."""
    launched = time.time()
    proc = subprocess.run([*CHILD, "--compile", compile_with, "--steps", str(steps),
                           "--model", model], capture_output=True, text=True, env=env,
                          timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{compile_with} failed:\n{proc.stderr[-4000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["launched"] = launched
    ended = out["ended"]
    out["steps"] = [ended[0]] + [b - a for a, b in itertools.pairwise(ended)]
    return out


def libraries_ready(cache_dir: Path, since: float, limit: float = 3600) -> float | None:
    """Seconds from ``since`` until the fused worker of ``cache_dir`` has
    drained its queue (every library stored); None past ``limit``. Returns
    once the worker has left too (on a machine's first run it builds
    Inductor's precompiled headers after the libraries)."""
    from ltc_cache.graph.fused.queue import FuseQueue

    queue = FuseQueue(cache_dir)
    deadline = time.time() + limit
    drained = None
    while time.time() < deadline:
        if drained is None and not queue.pending():
            drained = time.time() - since
        if drained is not None and not queue.worker_running():
            return drained
        time.sleep(0.25)
    return None


def fused_counts(cache_dir: Path) -> dict[str, int]:
    proc = subprocess.run([sys.executable, "-m", "ltc_cache.cli", "--dir", str(cache_dir),
                           "stats", "--json"], capture_output=True, text=True, check=True)
    fused = json.loads(proc.stdout).get("kinds", {}).get("fused", {})
    return {part: fused.get(part, {}).get("entries", 0) for part in ("library", "refusal")}


def summary(out: dict) -> dict:
    later = out["steps"][1:]
    return {"first_s": out["steps"][0], "median_ms": 1000 * statistics.median(later),
            "worst_ms": 1000 * max(later)}


def plot(runs: dict[str, dict], path: Path, ready: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5))
    for name, out in runs.items():
        if name.endswith("warm"):
            continue
        axes.plot(out["ended"][1:], [1000 * s for s in out["steps"][1:]], marker=".",
                  label=name)
    if ready is not None:
        axes.axvline(ready, color="grey", linestyle="--", label="ltc_cache libraries ready")
    axes.set_xlabel("seconds since the process started")
    axes.set_ylabel("iteration (ms)")
    axes.set_yscale("log")
    axes.set_title("A first run, step by step (steps after the first)")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.first_run",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["small-gpt", "gpt2-small"], default="small-gpt")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--variants", default="eager,inductor,ltc-off,ltc")
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep each run's cache directories here (default: a temporary "
                             "directory, removed), for `ltc-cache ls` and the worker's log")
    add_arguments(parser, "first_run")
    args = parser.parse_args(argv)
    recorder = Recorder.from_args("tools.bench.first_run", args, argv)
    variants = args.variants.split(",")
    runs: dict[str, dict] = {}
    ready = counts = None
    with tempfile.TemporaryDirectory(prefix="bench-first-run-") as scratch:
        root = Path(scratch) if args.keep is None else args.keep
        root.mkdir(parents=True, exist_ok=True)
        if any(root.iterdir()):
            raise SystemExit(f"{root} is not empty: each run starts from a fresh machine")
        if "eager" in variants:
            runs["eager"] = run("eager", args.model, args.steps, _env(root / "eager"))
        if "inductor" in variants:
            env = _env(root / "inductor")
            runs["Inductor cold"] = run("inductor", args.model, args.steps, env)
            runs["Inductor warm"] = run("inductor", args.model, args.steps, env)
        if "ltc-off" in variants:
            env = _env(root / "off", LTC_CACHE_FUSE="off")
            runs["ltc_cache cold, fused tier off"] = run("ltc", args.model, args.steps, env)
        if "ltc" in variants:
            env = _env(root / "ltc")
            cold = runs["ltc_cache cold"] = run("ltc", args.model, args.steps, env)
            ready = libraries_ready(root / "ltc" / "ltc", cold["launched"])
            counts = fused_counts(root / "ltc" / "ltc")
            runs["ltc_cache warm"] = run("ltc", args.model, args.steps, env)
    print(f"{args.model}, {args.steps} iterations, threads {next(iter(runs.values()))['threads']}")
    print("| run | first iteration (s) | later: median (ms) | later: worst (ms) |")
    print("|---|---:|---:|---:|")
    for name, out in runs.items():
        s = summary(out)
        print(f"| {name} | {s['first_s']:.2f} | {s['median_ms']:.1f} | {s['worst_ms']:.1f} |")
    off, on = runs.get("ltc_cache cold, fused tier off"), runs.get("ltc_cache cold")
    if off and on:
        base = summary(off)["median_ms"]
        print(f"cold default against fused tier off: median {summary(on)['median_ms'] / base:.2f}x,"
              f" worst {summary(on)['worst_ms'] / base:.2f}x")
    if counts is not None:
        print(f"libraries ready {ready:.1f} s after the cold process started"
              if ready is not None else "libraries not ready within the limit",
              f"({counts['library']} libraries, {counts['refusal']} refusals)")
    inductor = runs.get("Inductor cold")
    if inductor and ready is not None:
        print(f"ready / Inductor's cold first iteration: {ready / inductor['steps'][0]:.2f}x")
    if args.plot:
        plot(runs, args.plot, ready)
    if recorder:
        rows = []
        for name, out in runs.items():
            row = {"model": args.model, "run": name, **summary(out), "vs_off": None,
                   "libraries": None}
            if off and name.startswith("ltc_cache cold"):
                row["vs_off"] = row["median_ms"] / summary(off)["median_ms"]
            if name == "ltc_cache cold" and counts is not None:
                row["libraries"] = (f"{ready:.0f} s ({counts['library']} libraries, "
                                    f"{counts['refusal']} refusals)" if ready else "not ready")
            rows.append({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})
        recorder.write("first_run", [{"id": "runs", "columns": COLUMNS, "rows": rows}],
                       threads="default", merge_on={"runs": ("model", "run")},
                       describe=DESCRIBE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
