"""Time to first result through torch.compile, cold process against warm
process, per model: backend="ltc_cache" beside backend="inductor" with its
own caches on (FX graph cache and AOTAutograd cache), in one run.

    python tools/bench_compile.py [--models gpt2,cnn] [--repeats 3] [--markdown] [--train]

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
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ["gpt2", "bert", "llama", "t5", "transformer_encoder", "cnn"]
TRAIN_MODELS = ["gpt2", "llama", "bert"]


def train_child(model_name: str, backend: str) -> dict:
    """One model in train(): the first AdamW step through torch.compile,
    then steady steps, and the same steps in eager on a copy."""
    import copy

    import torch
    from compile_models import MODELS as BUILDERS
    from compile_models import loss_of

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
    sys.path.insert(0, str(ROOT / "tests"))
    if train:
        report = train_child(model_name, backend)
        _add_ltc_stats(report, backend)
        print(json.dumps(report))
        return
    from compile_models import MODELS as BUILDERS
    from compile_models import first_tensor

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


TRAIN = False  # --train: every child times training


def run_child(model: str, backend: str, env: dict[str, str]) -> dict:
    command = [sys.executable, __file__, "--child", model, backend]
    proc = subprocess.run(command + (["--train"] if TRAIN else []),
                          capture_output=True, text=True, env=env, timeout=1800)
    return child_result(proc)


def child_result(proc: subprocess.CompletedProcess[str]) -> dict:
    """A child's JSON report, or why it failed."""
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"failed": tail[0][:200]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cold_and_warm(model: str, backend: str, scratch: Path) -> tuple[dict, dict]:
    env = child_env(Path(tempfile.mkdtemp(prefix=f"{backend}-", dir=scratch)))
    return run_child(model, backend, env), run_child(model, backend, env)


def child_env(directory: Path) -> dict[str, str]:
    """The environment of a measured process: its caches (ltc_cache's, the
    program signing key's, Inductor's, Python's bytecode) in ``directory``,
    one thread."""
    env = dict(os.environ)
    env.update({
        "LTC_CACHE_DIR": str(directory / "ltc"),
        "XDG_CONFIG_HOME": str(directory / "config"),
        "TORCHINDUCTOR_CACHE_DIR": str(directory / "inductor"),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
        "OMP_NUM_THREADS": "1",
        # Inductor compiles in this process rather than in a pool of worker
        # processes, whose start-up would dominate these small graphs.
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
        # Start-up figures of the TorchScript tier: no background worker
        # compiling beside the measured process (tools/bench_fused.py
        # measures the fused tier).
        "LTC_CACHE_FUSE": "off",
    })
    for name in ("LTC_CACHE_DISABLE", "LTC_CACHE_READONLY", "LTC_CACHE_REMOTE"):
        env.pop(name, None)
    return bytecode_as_installed(env, directory)


def bytecode_as_installed(env: dict[str, str], directory: Path) -> dict[str, str]:
    """``env`` where a process runs ltc_cache as an installed package runs:
    its bytecode compiled once (by the first process, under ``directory``),
    as torch's and transformers' already are, even where the environment
    sets PYTHONDONTWRITEBYTECODE."""
    env["PYTHONPYCACHEPREFIX"] = str(directory / "pycache")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def median(runs: list[dict], field: str) -> float | None:
    values = [r[field] for r in runs if field in r]
    return statistics.median(values) if values else None


def add_runs(row: dict, runs: dict[str, list[dict]], medians: dict[str, str]) -> None:
    """Into ``row``, for each label of ``runs``: its first failure, the
    median of each run field ``medians`` names (``{"s": "first_s"}`` writes
    ``{label}_s``) and the largest error."""
    for label, results in runs.items():
        failed = [r["failed"] for r in results if "failed" in r]
        if failed:
            row[f"{label}_failed"] = failed[0]
        for suffix, field in medians.items():
            row[f"{label}_{suffix}"] = median(results, field)
        row[f"{label}_max_error"] = max((r["max_error"] for r in results
                                         if "max_error" in r), default=None)


def measure(models: list[str], repeats: int) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-compile-") as scratch:
        for model in models:
            runs: dict[str, list[dict]] = {}
            for _ in range(repeats):
                # Interleaved, so that a slow spell of a shared machine falls
                # on both backends.
                for backend in ("ltc_cache", "inductor"):
                    cold, warm = cold_and_warm(model, backend, Path(scratch))
                    runs.setdefault(f"{backend}_cold", []).append(cold)
                    runs.setdefault(f"{backend}_warm", []).append(warm)
                runs.setdefault("dynamo_only", []).append(
                    cold_and_warm(model, "eager", Path(scratch))[0])
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


def seconds(value: float | None) -> str:
    return "failed" if value is None else f"{value:.2f} s"


def ratio(a: float | None, b: float | None, suffix: str = "") -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}{suffix}"


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None, help="comma-separated (default: all; "
                        "with --train: " + ",".join(TRAIN_MODELS) + ")")
    parser.add_argument("--train", action="store_true", help="time a first training step")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--markdown", action="store_true", help="print the tables only")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "BACKEND"), help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        child(*options.child, train=options.train)
        return
    global TRAIN
    TRAIN = options.train
    models = options.models or ",".join(TRAIN_MODELS if options.train else MODELS)
    rows = measure([m for m in models.split(",") if m], options.repeats)
    if not options.markdown:
        print(json.dumps(rows, indent=1))
    print(markdown(rows))


if __name__ == "__main__":
    main()
