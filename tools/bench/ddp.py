"""DistributedDataParallel's steady step, ltc_cache against eager DDP, side
by side in the same ranks.

    python -m tools.bench.ddp [--ranks 2,4] [--rounds 8] [--steps 4] [--bucket-mb MB] [--markdown]
                              [--results]   # its rows into benchmarks/results/ddp.json

For each world size, ``torchrun`` starts that many gloo ranks (CPU, one
intra-op thread each) twice over one cache directory: a cold run that
stores the programs, then the measured run. In the measured run every rank
holds four copies of one GPT-2 (4 layers, hidden 128, sequence 64, 4
sequences a rank), each with its AdamW: eager ``DDP(model)``,
``DDP(ltc_cache.compile(model))``, ``ltc_cache.compile(DDP(model))``, and
the latter again with ``torch._dynamo.config.optimize_ddp = False`` (its
graph not cut at DDP's buckets: one autograd node, whose gradients all
reach the reducer at the backward's end). It times their steps (forward,
backward with its gradient all-reduce, optimizer step) in interleaved
rounds, every step started together on every rank (a barrier), so a slow
spell of the shared machine falls on every variant, and reports the median
step of each and its ratio to eager DDP's, the time one all-reduce of all
the gradients takes alone, the frames the warm ranks captured, and when
the first bucket's all-reduce started, as a share of the backward's time
(a comm hook notes it: 100% is no overlap).
``--bucket-mb`` is DDP's ``bucket_cap_mb`` (default: DDP's own, a 1 MiB
first bucket, then 25 MiB).
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

from tools.harness import child_env
from tools.results import Recorder, add_arguments

VARIANTS = ("eager_ddp", "ddp_of_compiled", "compiled_ddp", "compiled_ddp_uncut")
BATCH, SEQ, VOCAB = 4, 64, 512


def _model():
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=4, n_embd=128, n_head=4, vocab_size=VOCAB, n_positions=SEQ, bos_token_id=0,
        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config).train()


def rank_main(out: Path, rounds: int, steps: int, bucket_mb: float | None) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ltc_cache

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(rank))
    nets, optimizers = {}, {}
    launches: list[float] = []  # when each bucket's all-reduce started, this step

    def timed_all_reduce(group, bucket):
        launches.append(time.perf_counter())
        return allreduce_hook(group, bucket)

    for variant in VARIANTS:
        model = _model()
        if variant == "ddp_of_compiled":
            ddp = net = DDP(ltc_cache.compile(model), bucket_cap_mb=bucket_mb)
        else:
            ddp = net = DDP(model, bucket_cap_mb=bucket_mb)
            if variant != "eager_ddp":  # compiled_ddp and compiled_ddp_uncut
                net = ltc_cache.compile(ddp)
        ddp.register_comm_hook(None, timed_all_reduce)
        nets[variant], optimizers[variant] = net, torch.optim.AdamW(model.parameters(), lr=1e-4)
    first_reduce: dict[str, list[float]] = {variant: [] for variant in VARIANTS}

    def step(variant: str) -> float:
        dist.barrier()
        start = time.perf_counter()
        optimizers[variant].zero_grad()
        with torch._dynamo.config.patch(optimize_ddp=variant != "compiled_ddp_uncut"):
            loss = nets[variant](ids, labels=ids).loss
            launches.clear()
            backward = time.perf_counter()
            loss.backward()  # returns once every bucket is reduced
            first_reduce[variant].append(
                (launches[0] - backward) / (time.perf_counter() - backward))
        optimizers[variant].step()
        return time.perf_counter() - start

    def all_reduce() -> float:
        """One all-reduce of every gradient, alone: at most what overlapping
        it with the backward could hide."""
        flat = torch.cat([p.grad.flatten() for p in nets["eager_ddp"].parameters()])
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(flat)
        return time.perf_counter() - start

    first = {variant: step(variant) for variant in VARIANTS}  # loads (or captures) here
    times: dict[str, list[float]] = {variant: [] for variant in (*VARIANTS, "all_reduce")}
    for _ in range(rounds):
        for variant in VARIANTS:
            times[variant] += [step(variant) for _ in range(steps)]
        times["all_reduce"] += [all_reduce() for _ in range(steps)]
    result = {"first_s": first,
              "step_s": {v: statistics.median(t) for v, t in times.items() if t},
              "first_reduce": {v: statistics.median(t) for v, t in first_reduce.items()},
              "frames": int(torch._dynamo.utils.counters["frames"]["ok"]),
              "stats": ltc_cache.stats()}
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # past torch's teardown of the process group (see tests/children/ddp.py)


def run_ranks(ranks: int, directory: Path, port: int, argv: list[str]) -> list[dict]:
    out = Path(tempfile.mkdtemp(dir=directory))
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    proc = subprocess.run([torchrun, f"--nproc_per_node={ranks}", f"--master_port={port}",
                           "-m", "tools.bench.ddp", "--rank-out", str(out), *argv],
                          capture_output=True, text=True, env=child_env(directory), timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-4000:])
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]


def measure(world_sizes: list[int], argv: list[str]) -> list[dict]:
    rows, port = [], 29900
    with tempfile.TemporaryDirectory(prefix="bench-ddp-") as scratch:
        for ranks in world_sizes:
            directory = Path(tempfile.mkdtemp(dir=scratch))
            run_ranks(ranks, directory, port, [*argv, "--rounds", "0"])  # cold: stores
            every = run_ranks(ranks, directory, port + 1, argv)
            port += 2
            zero = every[0]
            row = {"ranks": ranks, "load": os.getloadavg()[0],
                   "warm_frames": max(r["frames"] for r in every),
                   **{f"{v}_s": zero["step_s"][v] for v in (*VARIANTS, "all_reduce")},
                   **{f"{v}_first_reduce": zero["first_reduce"][v] for v in VARIANTS},
                   **{f"{v}_first_s": zero["first_s"][v] for v in VARIANTS}}
            rows.append(row)
            print(json.dumps({**row, "stats": zero["stats"]}), file=sys.stderr)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| ranks | eager DDP step | DDP(ltc_cache.compile(m)) | ratio "
             "| ltc_cache.compile(DDP(m)) | ratio | the same, not cut at buckets | ratio "
             "| all-reduce of the gradients alone | warm frames | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        eager = r["eager_ddp_s"]
        lines.append(
            f"| {r['ranks']} | {eager * 1e3:.1f} ms "
            f"| {r['ddp_of_compiled_s'] * 1e3:.1f} ms | {r['ddp_of_compiled_s'] / eager:.2f}x "
            f"| {r['compiled_ddp_s'] * 1e3:.1f} ms | {r['compiled_ddp_s'] / eager:.2f}x "
            f"| {r['compiled_ddp_uncut_s'] * 1e3:.1f} ms "
            f"| {r['compiled_ddp_uncut_s'] / eager:.2f}x "
            f"| {r['all_reduce_s'] * 1e3:.1f} ms | {r['warm_frames']} | {r['load']:.1f} |")
    lines += ["", "When the first bucket's all-reduce starts, in the backward's time:", "",
              "| ranks | eager DDP | DDP(ltc_cache.compile(m)) | ltc_cache.compile(DDP(m)) "
              "| the same, not cut at buckets |", "|---|---|---|---|---|"]
    lines += [f"| {r['ranks']} | " + " | ".join(f"{r[f'{v}_first_reduce']:.0%}" for v in VARIANTS)
              + " |" for r in rows]
    return "\n".join(lines)


def results_rows(rows: list[dict]) -> list[dict]:
    """ddp.json's ``steps`` rows: milliseconds, ratios to eager DDP, and
    when the first bucket's all-reduce starts (percent of the backward)."""
    out = []
    for r in rows:
        eager = r["eager_ddp_s"]
        row = {"ranks": r["ranks"], "eager_ms": round(eager * 1e3, 1)}
        for variant, key in (("ddp_of_compiled", "ddp_of_compiled"),
                             ("compiled_ddp", "compiled_ddp"), ("compiled_ddp_uncut", "uncut")):
            row[f"{key}_ms"] = round(r[f"{variant}_s"] * 1e3, 1)
            row[f"{key}_ratio"] = round(r[f"{variant}_s"] / eager, 2)
        row.update(allreduce_ms=round(r["all_reduce_s"] * 1e3, 1),
                   warm_frames=r["warm_frames"], load=round(r["load"], 1))
        for variant, key in zip(VARIANTS, ("eager", "ddp_of_compiled", "compiled_ddp", "uncut"),
                                strict=True):
            row[f"first_bucket_{key}"] = round(100 * r[f"{variant}_first_reduce"])
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.ddp",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--bucket-mb", type=float, default=None)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--rank-out", type=Path, help=argparse.SUPPRESS)
    add_arguments(parser, "ddp")
    args = parser.parse_args(argv)
    recorder = None if args.rank_out else Recorder.from_args("tools.bench.ddp", args, argv)
    if args.rank_out:
        rank_main(args.rank_out, args.rounds, args.steps, args.bucket_mb)
    passed = ["--rounds", str(args.rounds), "--steps", str(args.steps)]
    if args.bucket_mb is not None:
        passed += ["--bucket-mb", str(args.bucket_mb)]
    rows = measure([int(n) for n in args.ranks.split(",")], passed)
    print(markdown(rows) if args.markdown else json.dumps(rows, indent=1))
    if recorder:
        recorder.write("ddp", [{"id": "steps", "rows": results_rows(rows)}],
                       threads="1 thread a rank", merge_on={"steps": ("ranks",)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
