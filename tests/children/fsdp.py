"""FSDP2 training through ltc_cache, one rank of it (run by torchrun).

``torchrun --nproc_per_node=N tests/children/fsdp.py ORDER OUT_DIR [--steps 3] [--layers 2]
[--use-cache]``

Each rank trains transformers' GPT-2 (small config, ``labels=``) with AdamW
on its share of one global batch, through ``fully_shard`` (FSDP2, gloo,
CPU) on each block and on the model, compiled in ``ORDER``:

- ``compiled_fsdp``: ``ltc_cache.compile(model)`` after ``fully_shard``
- ``eager``: FSDP2 as it is (for the benchmark)
- ``inductor``: ``torch.compile(model)`` after ``fully_shard`` (for the benchmark)

and writes ``OUT_DIR/rank{R}.json``: the global loss of each step (the mean
of the ranks' losses), Dynamo's frames (captures and visits), AOTAutograd's
traces, ltc_cache's counters and program logs, the seconds of the first
step and of each later one. Unless ``--no-eager``, every rank then runs the
same steps through eager FSDP2 on a model built the same way (``eager``:
its losses, ``eager_step_s``: its step times).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import time
from pathlib import Path
from typing import NoReturn

from helpers import exit_skipping_teardown

from tools.probes import dynamo_frames

BATCH_PER_RANK, SEQ = 2, 8
ORDERS = ("compiled_fsdp", "eager", "inductor")


def _model(layers: int):
    import torch
    import transformers

    from zoo.compile_models import VOCAB

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=layers, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32, bos_token_id=0,
        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config)
    model.train()
    return model


def _shard_blocks(model) -> None:
    from torch.distributed.fsdp import fully_shard

    for block in model.transformer.h:
        fully_shard(block)


def _build(order: str, layers: int):
    """The model of ``order``, ready to train, and the module whose
    parameters the optimizer steps."""
    import torch
    from torch.distributed.fsdp import fully_shard

    import ltc_cache

    model = _model(layers)
    _shard_blocks(model)
    fully_shard(model)
    if order == "compiled_fsdp":
        return ltc_cache.compile(model), model
    if order == "inductor":
        return torch.compile(model), model
    return model, model


def _batch(world: int):
    import torch

    from zoo.compile_models import VOCAB

    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (BATCH_PER_RANK * world, SEQ), generator=generator)


def _steps(net, parameters, ids, steps: int, reduce,
           use_cache: bool = False) -> tuple[list[float], list[float]]:
    """Losses (all-reduced) and each step's seconds; ``use_cache``: the
    model's own default (a key/value cache built each forward and handed to
    each block), else ``use_cache=False``."""
    import torch

    optimizer = torch.optim.AdamW(parameters, lr=1e-3)
    losses, seconds = [], []
    for _ in range(steps):
        start = time.perf_counter()
        optimizer.zero_grad()
        # No key/value cache: training has no use for one, and each block
        # would take it as an input (README, FSDP2).
        loss = (net(ids, labels=ids) if use_cache else net(ids, labels=ids, use_cache=False)
                )["loss"]
        loss.backward()
        optimizer.step()
        seconds.append(time.perf_counter() - start)
        losses.append(float(reduce(loss.detach().clone())))
    return losses, seconds




def main(argv: list[str] | None = None) -> NoReturn:
    parser = argparse.ArgumentParser()
    parser.add_argument("order", choices=ORDERS)
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--no-eager", action="store_true")
    parser.add_argument("--use-cache", action="store_true",
                        help="the config's use_cache (on), as a user who leaves it")
    parser.add_argument("--hang-after", type=float, default=300.0)
    options = parser.parse_args(argv)
    # A rank that hangs (a collective the other ranks never join) prints
    # every thread's stack and exits, instead of holding the test to its timeout.
    faulthandler.dump_traceback_later(options.hang_after, exit=True)

    import torch
    import torch.distributed as dist

    import ltc_cache
    from tools.probes import AOT, count_aot_traces, program_logs

    count_aot_traces()
    visited, captured = dynamo_frames()
    logs = program_logs()
    if os.environ.get("FSDP_CHILD_LOG"):  # the backend's reasons too, on stderr
        import logging
        logging.basicConfig(level=logging.INFO)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    ids = _batch(world)[rank * BATCH_PER_RANK:(rank + 1) * BATCH_PER_RANK]

    def global_mean(value):
        dist.all_reduce(value)
        return value / world

    net, model = _build(options.order, options.layers)
    losses, seconds = _steps(net, model.parameters(), ids, options.steps, global_mean,
                             options.use_cache)
    result = {"rank": rank, "world": world, "order": options.order, "losses": losses,
              "first_step_s": seconds[0], "step_s": seconds[1:], "stats": ltc_cache.stats(),
              "frames_ok": int(torch._dynamo.utils.counters["frames"]["ok"]),
              "aot_traces": AOT["traces"], "logs": logs, "visited": visited,
              "captures": len(captured), "loadavg": os.getloadavg()[0]}
    if not options.no_eager:
        eager, eager_model = _build("eager", options.layers)
        result["eager"], result["eager_step_s"] = _steps(
            eager, eager_model.parameters(), ids, options.steps, global_mean, options.use_cache)
    Path(options.out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    exit_skipping_teardown()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
