"""Peak memory of one gradient-checkpointed training step, ltc_cache
against eager, in a warm process.

    MALLOC_MMAP_THRESHOLD_=65536 python -m tools.bench.ckpt_memory [--fused] [gpt2|llama ...]

For each model (4 layers, hidden 256, batch 8 x 256 tokens, non-reentrant
checkpointing), a cold process stores the program, then a warm one runs
``ltc_cache.compile(model)`` beside an eager copy and measures each step's
peak RSS over the RSS at its start (the kernel's high-water mark, reset
through ``/proc/self/clear_refs`` before the step; the least of three
steps). ``MALLOC_MMAP_THRESHOLD_`` makes malloc give freed blocks back,
so the high-water mark follows what is in use. Linux only.

``--fused``: the cold process compiles the fused libraries before its
first step (``LTC_CACHE_FUSE=sync``), so the warm one runs each plan's
library where one was kept (minutes of g++ a model).

``--results``: the warm rows into benchmarks/results/ckpt_memory.json (its
``torchscript`` table, or with ``--fused`` its ``fused`` one).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.harness import child_env, tool_argv
from tools.results import Recorder, add_arguments

LABELS = {"gpt2": "GPT-2", "llama": "Llama"}


def _rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _peak_of_step(model, ids) -> float:
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to VmRSS
    start = _rss("VmRSS:")
    model(input_ids=ids, labels=ids).loss.backward()
    return (_rss("VmHWM:") - start) / 2**20


def _model(name: str):
    import transformers

    if name == "gpt2":
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=4, n_embd=256, n_head=4, vocab_size=128, n_positions=256,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=512,
        vocab_size=128, max_position_embeddings=256))


def child(name: str) -> None:
    import torch

    import ltc_cache

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = _model(name).train()
    eager = copy.deepcopy(model)
    for m in (model, eager):
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    compiled = ltc_cache.compile(model)
    ids = torch.randint(0, 128, (8, 256), generator=torch.Generator().manual_seed(1))
    peaks: dict[str, list[float]] = {"ltc_cache": [], "eager": []}
    for step in range(5):  # two steps to settle, then three measured
        for label, m, owner in (("ltc_cache", compiled, model), ("eager", eager, eager)):
            if step < 2:
                m(input_ids=ids, labels=ids).loss.backward()
            else:
                peaks[label].append(_peak_of_step(m, ids))
            owner.zero_grad(set_to_none=True)
    print(json.dumps({"model": name, **{k: min(v) for k, v in peaks.items()},
                      **{k: ltc_cache.stats().get(k, 0)
                         for k in ("program_hits", "fused_loads", "fused_plan_loads")}}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.ckpt_memory",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["gpt2", "llama"], metavar="MODEL",
                        help="gpt2 and/or llama (default: both)")
    parser.add_argument("--fused", action="store_true",
                        help="compile the fused libraries in the cold process first")
    parser.add_argument("--child", metavar="MODEL", help=argparse.SUPPRESS)
    add_arguments(parser, "ckpt_memory")
    args = parser.parse_args(argv)
    if args.child:
        child(args.child)
        return 0
    threshold = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    recorder = Recorder.from_args("tools.bench.ckpt_memory", args, argv,
                                  prefix=f"MALLOC_MMAP_THRESHOLD_={threshold}" if threshold
                                  else "")
    fused = args.fused
    rows = []
    for name in args.models:
        with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as scratch:
            env = child_env(Path(scratch))
            for process, fuse in (("cold", "sync"), ("warm", "background")):
                env["LTC_CACHE_FUSE"] = fuse if fused else "off"
                proc = subprocess.run(tool_argv("bench.ckpt_memory", "--child", name),
                                      capture_output=True, text=True, env=env, check=True)
                result = json.loads(proc.stdout.strip().splitlines()[-1])
                ratio = result["ltc_cache"] / result["eager"]
                print(f"{name} {process}: ltc_cache {result['ltc_cache']:.1f} MB, eager "
                      f"{result['eager']:.1f} MB, {ratio:.2f}x "
                      f"(programs loaded: {result['program_hits']}, libraries loaded: "
                      f"{result['fused_loads']} of regions, {result['fused_plan_loads']} "
                      "of plans)")
        rows.append(results_row(name, result, fused))
    if recorder:
        table = "fused" if fused else "torchscript"
        recorder.write("ckpt_memory", [{"id": table, "rows": rows}], threads=1,
                       merge_on={table: ("model",)})
    return 0


def results_row(name: str, warm: dict, fused: bool) -> dict:
    """A row of ckpt_memory.json from the warm process's report."""
    row = {"model": LABELS.get(name, name), "eager_mb": round(warm["eager"], 1),
           "ltc_mb": round(warm["ltc_cache"], 1),
           "ratio": round(warm["ltc_cache"] / warm["eager"], 2)}
    if fused:
        plans, regions = warm["fused_plan_loads"], warm["fused_loads"]
        row["libraries"] = (f"{plans} whole-plan librar{'y' if plans == 1 else 'ies'}, "
                            f"{regions} region libraries")
    return row


if __name__ == "__main__":
    sys.exit(main())
