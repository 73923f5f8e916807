"""FSDP2 training through ltc_cache against eager FSDP2 and Inductor.

    python -m tools.bench.fsdp [--ranks 2,4] [--steps 6] [--layers 2] [--no-inductor]
                               [--results]   # its rows into benchmarks/results/fsdp.json

For each number of ranks, torchrun launches of ``tests/children/fsdp.py``
(GPT-2, each block and the model ``fully_shard``-ed, gloo, CPU, AdamW),
over a new cache directory, cold then warm, ltc_cache's two first:

- ``ltc_cache.compile(model)``: the first step's seconds cold and warm,
  the median of the later steps (steady), and, in the same processes,
  eager FSDP2's median step on a model built the same way;
- ``torch.compile(model)`` (Inductor, its FX graph and AOTAutograd caches
  in a directory of its own, compile workers in-process): the first
  step's seconds cold and warm.

Prints a markdown table (rank 0's figures; every rank's first step is
about the same, as they wait on each other's collectives) and the load
average at each launch: timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.harness import CHILDREN, with_import_roots
from tools.results import Recorder, add_arguments, rounded

CHILD = CHILDREN / "fsdp.py"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(order: str, ranks: int, steps: int, layers: int, env: dict[str, str],
           eager: bool) -> dict:
    """One torchrun launch; rank 0's result."""
    with tempfile.TemporaryDirectory() as out:
        command = [str(Path(sys.executable).with_name("torchrun")), f"--nproc_per_node={ranks}",
                   f"--master_port={_free_port()}", str(CHILD), order, out,
                   "--steps", str(steps), "--layers", str(layers)]
        if not eager:
            command.append("--no-eager")
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"{order} on {ranks} ranks failed:\n{proc.stderr[-3000:]}")
        return json.loads(Path(out, "rank0.json").read_text())


def measure(ranks: int, args: argparse.Namespace, scratch: Path) -> dict:
    env = with_import_roots(dict(os.environ, OMP_NUM_THREADS="1", LTC_CACHE_FUSE="off",
                                 LTC_CACHE_DIR=str(scratch / f"ltc{ranks}"),
                                 XDG_CONFIG_HOME=str(scratch / "config"),
                                 TORCHINDUCTOR_CACHE_DIR=str(scratch / f"inductor{ranks}"),
                                 TORCHINDUCTOR_COMPILE_THREADS="1"))
    row: dict = {"ranks": ranks}
    # ltc_cache's cold and warm launches back to back: a plan's key covers
    # ltc_cache's own decompositions and partitioner, so an edit of those
    # between the two (a shared checkout) would make the warm one trace.
    for phase in ("cold", "warm"):
        result = launch("compiled_fsdp", ranks, args.steps, args.layers, env, eager=True)
        row[f"ltc_{phase}_first_s"] = result["first_step_s"]
        row[f"ltc_{phase}_load"] = result["loadavg"]
    row["ltc_steady_s"] = statistics.median(result["step_s"])
    row["eager_steady_s"] = statistics.median(result["eager_step_s"][1:])
    row["eager_first_s"] = result["eager_step_s"][0]
    row["warm_captures"] = result["captures"] + result["stats"].get("program_captures", 0)
    row["warm_aot_traces"] = result["aot_traces"]
    row["warm_ltc_traces"] = result["stats"]["traces"]
    row["losses_error"] = max(abs(a - b) for a, b in zip(result["losses"], result["eager"],
                                                         strict=True))
    if not args.no_inductor:
        for phase in ("cold", "warm"):
            inductor = launch("inductor", ranks, args.steps, args.layers, env, eager=False)
            row[f"inductor_{phase}_first_s"] = inductor["first_step_s"]
            row[f"inductor_{phase}_load"] = inductor["loadavg"]
        row["inductor_warm_frames"] = inductor["frames_ok"]
    return row


def report(rows: list[dict]) -> str:
    lines = ["| ranks | eager step | ltc_cache step | ltc first cold | ltc first warm "
             "| Inductor first cold | Inductor first warm | ltc warm / Inductor warm "
             "| warm captures, AOT, LTC traces | loss error | load |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|"]
    for row in rows:
        inductor_warm = row.get("inductor_warm_first_s")
        ratio = f"{row['ltc_warm_first_s'] / inductor_warm:.2f}x" if inductor_warm else "-"
        loads = [row[k] for k in row if k.endswith("_load")]
        lines.append(
            f"| {row['ranks']} | {row['eager_steady_s']:.3f} | {row['ltc_steady_s']:.3f} "
            f"| {row['ltc_cold_first_s']:.2f} | {row['ltc_warm_first_s']:.2f} "
            f"| {row.get('inductor_cold_first_s', float('nan')):.2f} "
            f"| {inductor_warm or float('nan'):.2f} | {ratio} "
            f"| {row['warm_captures']}, {row['warm_aot_traces']}, {row['warm_ltc_traces']} "
            f"| {row['losses_error']:.1e} | {min(loads):.1f}-{max(loads):.1f} |")
    return "\n".join(lines)


def results_rows(rows: list[dict]) -> list[dict]:
    """fsdp.json's ``steps`` rows (rank 0's figures)."""
    out = []
    for row in rows:
        inductor_warm = row.get("inductor_warm_first_s")
        out.append({"ranks": row["ranks"], "eager_step_s": round(row["eager_steady_s"], 3),
                    "ltc_step_s": round(row["ltc_steady_s"], 3),
                    "ltc_first_cold_s": round(row["ltc_cold_first_s"], 1),
                    "ltc_first_warm_s": round(row["ltc_warm_first_s"], 2),
                    "inductor_first_cold_s": rounded(row.get("inductor_cold_first_s"), 1),
                    "inductor_first_warm_s": rounded(inductor_warm, 1),
                    "warm_vs_inductor": round(row["ltc_warm_first_s"] / inductor_warm, 2)
                    if inductor_warm else None})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.fsdp",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--no-inductor", action="store_true")
    parser.add_argument("--json")
    add_arguments(parser, "fsdp")
    args = parser.parse_args(argv)
    recorder = Recorder.from_args("tools.bench.fsdp", args, argv)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for ranks in (int(r) for r in args.ranks.split(",")):
            rows.append(measure(ranks, args, Path(scratch)))
            print(json.dumps(rows[-1]), flush=True)
    print(report(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if recorder:
        recorder.write("fsdp", [{"id": "steps", "rows": results_rows(rows)}],
                       threads="1 thread a rank", merge_on={"steps": ("ranks",)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
