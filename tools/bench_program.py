"""Warm start of ``ltc_cache.compile`` (a stored program: no Dynamo capture)
against today's warm ``torch.compile(backend="ltc_cache")`` and Inductor's
warm start (its FX-graph and AOTAutograd caches on), side by side.

    python tools/bench_program.py [--models gpt2,mlp128] [--repeats 1] [--train] [--markdown]

Every measurement is a fresh Python process: "cold" over empty cache
directories, "warm" the next process over the same ones. The time is from
the compiled model's first call to its result (capture, loading and
compiling included; imports and model construction not), inference under
no_grad; with ``--train`` one training step instead (forward, backward,
AdamW step). One intra-op thread; Inductor compiles in-process
(TORCHINDUCTOR_COMPILE_THREADS=1). Peak RSS is the process's. Medians over
the repeats; on a shared machine compare the ratios, measured side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_compile import (  # tools/ is sys.path[0]
    add_runs,
    child_env,
    child_result,
    ratio,
    seconds,
)

ROOT = Path(__file__).resolve().parent.parent
MODELS = ["gpt2", "bert", "llama", "t5", "transformer_encoder", "mlp128"]
MODES = ("program", "ltc_cache", "inductor")


def build(name: str):
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from compile_models import MODELS as BUILDERS

    torch.manual_seed(0)
    if name == "mlp128":
        layers = []
        for _ in range(128):
            layers += [torch.nn.Linear(64, 64), torch.nn.ReLU()]
        return torch.nn.Sequential(*layers), (torch.randn(8, 64),)
    return BUILDERS[name]()


def child(model_name: str, mode: str, train: bool) -> None:
    import copy

    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT / "tests"))
    from compile_models import first_tensor, loss_of

    import ltc_cache

    model, args = build(model_name)
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


def run_child(model: str, mode: str, train: bool, env: dict[str, str]) -> dict:
    args = [sys.executable, __file__, "--child", model, mode, *(["--train"] if train else [])]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=1800)
    return child_result(proc)


def cold_and_warm(model: str, mode: str, train: bool, scratch: Path) -> tuple[dict, dict]:
    env = child_env(Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=scratch)))
    return run_child(model, mode, train, env), run_child(model, mode, train, env)


def measure(models: list[str], repeats: int, train: bool) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-program-") as scratch:
        for model in models:
            runs: dict[str, list[dict]] = {}
            for _ in range(repeats):
                for mode in MODES:  # interleaved: a slow spell falls on every mode
                    cold, warm = cold_and_warm(model, mode, train, Path(scratch))
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


def markdown(rows: list[dict]) -> str:
    lines = [
        "| model | program cold | **program warm** | ltc_cache warm | inductor warm "
        "| program warm / inductor warm | program warm / ltc_cache warm "
        "| warm RSS (program / ltc_cache / inductor) | warm: captures, traces, program hits "
        "| max error |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for r in rows:
        rss = " / ".join("-" if r.get(f"{m}_warm_rss_mb") is None
                         else f"{r[f'{m}_warm_rss_mb']:.0f}" for m in MODES)
        errors = [r.get(f"{m}_{p}_max_error") for m in MODES for p in ("cold", "warm")]
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--train", action="store_true", help="one training step instead")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child, args.train)
        return 0
    started = time.time()
    rows = measure(args.models.split(","), args.repeats, args.train)
    print(markdown(rows) if args.markdown else json.dumps(rows, indent=2))
    print(f"({time.time() - started:.0f} s, load average {os.getloadavg()[0]:.1f})",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
