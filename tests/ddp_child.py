"""Data-parallel training through ltc_cache, one rank of it (run by torchrun).

``torchrun --nproc_per_node=N tests/ddp_child.py ORDER OUT_DIR [--steps 3]``

Each rank trains transformers' GPT-2 (2 layers, ``labels=``, whose loss
breaks the graph) with AdamW on its share of one global batch, through
DistributedDataParallel (gloo, CPU) compiled in ``ORDER``:

- ``ddp_of_compiled``: ``DDP(ltc_cache.compile(model))``
- ``compiled_ddp``: ``ltc_cache.compile(DDP(model))``
- ``torch_compile_ddp``: ``torch.compile(DDP(model), backend="ltc_cache")``
- ``inductor_ddp``: ``torch.compile(DDP(model))`` (Inductor; for the benchmark)

and writes ``OUT_DIR/rank{R}.json``: the global loss of each step (the mean
of the ranks' losses), Dynamo's frames, AOTAutograd's traces, ltc_cache's
counters, and the seconds to the end of the first step. Rank 0 also runs
the same steps in one process on the whole global batch without DDP
(``reference``), which the losses must equal.
"""

from __future__ import annotations

import argparse
import copy
import faulthandler
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

sys.path.insert(0, str(Path(__file__).parent))

BATCH_PER_RANK, SEQ = 2, 8


def _model():
    import torch
    from compile_models import gpt2

    torch.manual_seed(0)
    model, _ = gpt2()
    model.train()
    return model


def _batch(world: int):
    import torch
    from compile_models import VOCAB

    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (BATCH_PER_RANK * world, SEQ), generator=generator)


def _steps(model, ids, steps: int, reduce=None) -> tuple[list[float], float]:
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, first = [], 0.0
    start = time.perf_counter()
    for step in range(steps):
        optimizer.zero_grad()
        loss = model(ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        value = loss.detach().clone()
        if reduce is not None:
            value = reduce(value)
        losses.append(float(value))
        if step == 0:
            first = time.perf_counter() - start
    return losses, first


def _count_visits() -> list[str]:
    """The code of each frame Dynamo's callback is handed (what
    ``counters["frames"]`` counts), by name."""
    from torch._dynamo import convert_frame

    visited: list[str] = []
    original = convert_frame.ConvertFrame.__call__

    def call(self, frame, *args, **kwargs):
        back = frame.f_back
        caller = f", from {back.f_code.co_qualname}" if back is not None else ""
        visited.append(f"{frame.f_code.co_qualname} ({Path(frame.f_code.co_filename).name}"
                       f"{caller})")
        return original(self, frame, *args, **kwargs)

    convert_frame.ConvertFrame.__call__ = call
    # Captures: Dynamo tracing a frame (a visit may end sooner, on a skip).
    original_compile = convert_frame._compile

    def compile_frame(code, *args, **kwargs):
        CAPTURES.append(code.co_qualname)
        return original_compile(code, *args, **kwargs)

    convert_frame._compile = compile_frame
    return visited


CAPTURES: list[str] = []


def main(argv: list[str] | None = None) -> NoReturn:
    parser = argparse.ArgumentParser()
    parser.add_argument("order", choices=("ddp_of_compiled", "compiled_ddp",
                                          "torch_compile_ddp", "inductor_ddp"))
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--hang-after", type=float, default=240.0)
    options = parser.parse_args(argv)

    # A rank that hangs (a collective the other rank never joins) prints
    # every thread's stack and exits, instead of holding the test to its timeout.
    faulthandler.dump_traceback_later(options.hang_after, exit=True)

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from warm_children import AOT, count_aot_traces

    import ltc_cache

    count_aot_traces()
    visited = _count_visits()
    logs: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: logs.append(record.getMessage())  # type: ignore[method-assign]
    for name in ("ltc_cache.precompile", "ltc_cache.program"):
        logging.getLogger(name).setLevel(logging.INFO)
        logging.getLogger(name).addHandler(handler)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    model = _model()
    reference_model = copy.deepcopy(model) if rank == 0 else None
    ids = _batch(world)
    mine = ids[rank * BATCH_PER_RANK:(rank + 1) * BATCH_PER_RANK]

    if options.order == "ddp_of_compiled":
        net = DDP(ltc_cache.compile(model))
    elif options.order == "compiled_ddp":
        net = ltc_cache.compile(DDP(model))
    elif options.order == "torch_compile_ddp":
        net = torch.compile(DDP(model), backend="ltc_cache")
    else:  # for the benchmark: Inductor
        net = torch.compile(DDP(model))

    def global_mean(value):
        dist.all_reduce(value)
        return value / world

    losses, first = _steps(net, mine, options.steps, global_mean)
    result = {"rank": rank, "world": world, "order": options.order, "losses": losses,
              "first_step_s": first, "stats": ltc_cache.stats(),
              "frames_ok": int(torch._dynamo.utils.counters["frames"]["ok"]),
              "aot_traces": AOT["traces"], "logs": logs,
              "visited": visited,
              "captures": len(CAPTURES)}
    if reference_model is not None:
        result["reference"], _ = _steps(reference_model, ids, options.steps)
    Path(options.out, f"rank{rank}.json").write_text(json.dumps(result))
    # DDP's reducer goes before the process group it talks through.
    del net, model
    dist.barrier()
    dist.destroy_process_group()
    # Everything is written. A rank has still hung after this, in torch's
    # teardown at interpreter exit (faulthandler: the main thread past
    # main(), no Python frame below it) in 2 of about 40 launches on a
    # loaded machine; skip that teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
