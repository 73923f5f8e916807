"""Warm starts of functions Dynamo compiles as several frames (graph breaks):
``ltc_cache.compile`` (a stored program of frames) against Inductor's warm
start and ``torch.compile(backend="ltc_cache")``, side by side.

    python -m tools.bench.frames [--repeats 1] [--skip-ddp] [--ranks 2] [--only ddp] [--markdown]
                                 [--results]   # its rows into benchmarks/results/frames.json

Scenarios, each one training step (forward, backward, AdamW) timed from the
compiled model's first call to the end of the step (capture, loading and
compiling included; imports and model construction not):

- ``gpt2``: transformers' GPT-2 (2 layers) with ``labels=``, whose loss logs
  a warning through ``logging.Logger``: a graph break;
- ``branchy``: an MLP with a data-dependent branch (``if x.sum() > 0``);
- ``ddpN``: GPT-2 under DistributedDataParallel, ``torchrun`` with N ranks
  (``--ranks``, 2 by default; gloo, CPU), ``DDP(ltc_cache.compile(model))`` against
  ``torch.compile(DDP(model))`` (Inductor) and
  ``torch.compile(DDP(model), backend="ltc_cache")`` (``tests/children/ddp.py``;
  the time is rank 0's).

Every measurement is a fresh process: "cold" over empty cache directories,
"warm" the next over the same ones (ltc_cache's, the signing key's,
Inductor's FX-graph and AOTAutograd caches). One intra-op thread. Medians
over the repeats; on a shared machine compare the ratios.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools.harness import (
    CHILDREN,
    child_env,
    child_result,
    largest,
    median,
    ratio,
    run_child,
    seconds,
    tool_argv,
)
from tools.results import Recorder, add_arguments, numbers, rounded

MODES = {"program": "ltc_cache.compile", "inductor": "Inductor",
         "ltc_cache": "torch.compile(backend=\"ltc_cache\")"}
DDP_ORDERS = {"program": "ddp_of_compiled", "inductor": "inductor_ddp",
              "ltc_cache": "torch_compile_ddp"}


def _branchy():
    import torch

    class Branchy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = torch.nn.Sequential(*(torch.nn.Linear(64, 64) for _ in range(8)))
            self.second = torch.nn.Sequential(*(torch.nn.Linear(64, 64) for _ in range(8)))

        def forward(self, x):
            y = self.first(x)
            # Data-dependent: Dynamo breaks the graph here.
            y = torch.relu(y) if y.sum() > 0 else torch.tanh(y)
            return (self.second(y) ** 2).mean()

    torch.manual_seed(0)
    return Branchy(), (torch.randn(16, 64),), {}


def _gpt2():
    import torch

    from zoo.compile_models import gpt2

    torch.manual_seed(0)
    model, (ids,) = gpt2()
    return model, (ids,), {"labels": ids}


def child(scenario: str, mode: str) -> None:
    import torch

    import ltc_cache

    torch.set_num_threads(1)
    model, args, kwargs = _gpt2() if scenario == "gpt2" else _branchy()
    model.train()
    compiled = (ltc_cache.compile(model) if mode == "program"
                else torch.compile(model, backend=mode))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    start = time.perf_counter()
    out = compiled(*args, **kwargs)
    loss = out.loss if hasattr(out, "loss") else out
    loss.backward()
    optimizer.step()
    first = time.perf_counter() - start
    stats = ltc_cache.stats()
    print(json.dumps({"first_s": first, "loss": loss.item(),
                      "frames": int(torch._dynamo.utils.counters["frames"]["ok"]),
                      "traces": stats["traces"], "program_hits": stats.get("program_hits", 0)}))


def run_scenario(scenario: str, mode: str, directory: Path) -> dict:
    return run_child(tool_argv("bench.frames", "--child", scenario, mode), child_env(directory))


def run_ddp(mode: str, directory: Path, port: int, ranks: int) -> dict:
    out = directory / "out"
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("torchrun")), f"--nproc_per_node={ranks}",
         f"--master_port={port}", str(CHILDREN / "ddp.py"), DDP_ORDERS[mode],
         str(out)], capture_output=True, text=True, env=child_env(directory), timeout=1800)
    if proc.returncode != 0:
        return child_result(proc)
    every = [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]
    rank = every[0]
    error = max(abs(a - b) for r in every for a, b in zip(r["losses"], rank["reference"],
                                                           strict=True))
    return {"first_s": rank["first_step_s"], "frames": max(r["frames_ok"] for r in every),
            "traces": sum(r["stats"]["traces"] for r in every), "loss_error": error,
            "captures": max(r["captures"] for r in every),
            "program_hits": min(r["stats"].get("program_hits", 0) for r in every)}


def measure(repeats: int, scenarios: list[str], ranks: int) -> list[dict]:
    rows = []
    port = 29700
    with tempfile.TemporaryDirectory(prefix="bench-frames-") as scratch:
        for scenario in scenarios:
            runs: dict[str, list[dict]] = {}
            for _ in range(repeats):
                for mode in MODES:  # interleaved: a slow spell falls on every mode
                    directory = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=scratch))
                    for phase in ("cold", "warm"):
                        if scenario.startswith("ddp"):
                            port += 1
                            result = run_ddp(mode, directory, port, ranks)
                        else:
                            result = run_scenario(scenario, mode, directory)
                        runs.setdefault(f"{mode}_{phase}", []).append(result)
            row: dict = {"scenario": scenario}
            for label, results in runs.items():
                failed = [r["failed"] for r in results if "failed" in r]
                if failed:
                    row[f"{label}_failed"] = failed[0]
                row[f"{label}_s"] = median(results, "first_s")
                row[f"{label}_frames"] = largest(results, "frames", default=0)
                row[f"{label}_traces"] = largest(results, "traces", default=0)
                if any("loss_error" in r for r in results):
                    row[f"{label}_loss_error"] = largest(results, "loss_error")
                    row[f"{label}_captures"] = largest(results, "captures")
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [
        "| scenario | program cold | **program warm** | warm / cold "
        "| Inductor warm | **program warm / Inductor warm** "
        "| torch.compile(ltc_cache) warm | program warm: frames, LTC traces |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['scenario']} | {seconds(r.get('program_cold_s'))} "
            f"| {seconds(r.get('program_warm_s'))} "
            f"| {ratio(r.get('program_warm_s'), r.get('program_cold_s'), 'x')} "
            f"| {seconds(r.get('inductor_warm_s'))} "
            f"| {ratio(r.get('program_warm_s'), r.get('inductor_warm_s'), 'x')} "
            f"| {seconds(r.get('ltc_cache_warm_s'))} "
            f"| {r.get('program_warm_frames')}, {r.get('program_warm_traces')} |")
    return "\n".join(lines)


def results_rows(rows: list[dict]) -> list[dict]:
    """frames.json's ``training`` rows, a scenario a row."""
    def share(a: float | None, b: float | None) -> float | None:
        return None if a is None or not b else round(a / b, 2)

    return [{"scenario": r["scenario"], "program_cold_s": rounded(r.get("program_cold_s")),
             "program_warm_s": rounded(r.get("program_warm_s")),
             "warm_vs_cold": share(r.get("program_warm_s"), r.get("program_cold_s")),
             "inductor_warm_s": rounded(r.get("inductor_warm_s")),
             "program_vs_inductor": share(r.get("program_warm_s"), r.get("inductor_warm_s")),
             "torch_compile_warm_s": rounded(r.get("ltc_cache_warm_s")),
             "warm_counts": numbers([r.get("program_warm_frames"),
                                     r.get("program_warm_traces")])} for r in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.frames",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=2, metavar=("SCENARIO", "MODE"))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--skip-ddp", action="store_true")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--only", choices=("gpt2", "branchy", "ddp"), default=None)
    parser.add_argument("--markdown", action="store_true")
    add_arguments(parser, "frames")
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    recorder = Recorder.from_args("tools.bench.frames", args, argv)
    scenarios = ["gpt2", "branchy", f"ddp{args.ranks}"]
    if args.skip_ddp:
        scenarios.pop()
    if args.only:
        scenarios = [s for s in scenarios if s.startswith(args.only)]
    rows = measure(args.repeats, scenarios, args.ranks)
    print(markdown(rows) if args.markdown else json.dumps(rows, indent=1))
    if recorder:
        recorder.write("frames", [{"id": "training", "rows": results_rows(rows)}], threads=1,
                       merge_on={"training": ("scenario",)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
