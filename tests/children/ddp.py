"""Data-parallel training through ltc_cache, one rank of it (run by torchrun).

``torchrun --nproc_per_node=N tests/children/ddp.py ORDER OUT_DIR [--steps 3] [--model M]
[--bucket-mb MB]``

Each rank trains a model with AdamW on its share of one global batch,
through DistributedDataParallel (gloo, CPU) compiled in ``ORDER``. The
model (``--model``): transformers' GPT-2 (``gpt2``, the default: 2 layers,
``labels=``, whose loss breaks the graph), its sequence classifier
(``seqcls``: the last non-pad token's logits, ``labels=`` of one class a
sequence, ``config.problem_type`` set by the first forward), or a plain
MLP (``mlp``). The orders:

- ``ddp_of_compiled``: ``DDP(ltc_cache.compile(model))``
- ``compiled_ddp``: ``ltc_cache.compile(DDP(model))``
- ``torch_compile_ddp``: ``torch.compile(DDP(model), backend="ltc_cache")``
- ``inductor_ddp``: ``torch.compile(DDP(model))`` (Inductor; for the benchmark)

and writes ``OUT_DIR/rank{R}.json``: the global loss of each step (the mean
of the ranks' losses), Dynamo's frames, AOTAutograd's traces, ltc_cache's
counters, and the seconds to the end of the first step. Rank 0 also runs
the same steps in one process on the whole global batch without DDP
(``reference``), which the losses must equal, and writes how far its
weights end from the reference's (``weights_error``). Every rank then runs
the same steps through eager DDP (``eager_ddp``: its losses) and writes
how far its weights end from those (``eager_ddp_weights_error``), and a
digest of its weights (``weights``), which must be equal on every rank.
``compiled_nodes``: the compiled graphs' autograd nodes behind the last
step's loss (one per piece of a graph cut at DDP's gradient buckets,
``--bucket-mb`` being DDP's ``bucket_cap_mb``).
"""

from __future__ import annotations

import argparse
import copy
import faulthandler
import hashlib
import json
import os
import time
from pathlib import Path
from typing import NoReturn

from helpers import exit_skipping_teardown

from tools.probes import dynamo_frames

BATCH_PER_RANK, SEQ = 2, 8


class _Mlp:
    """A plain MLP whose forward returns its loss (no transformers)."""

    @staticmethod
    def build():
        import torch

        from zoo.compile_models import VOCAB

        class Mlp(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.embed = torch.nn.Embedding(VOCAB, 32)
                self.hidden = torch.nn.Linear(32, 64)
                self.out = torch.nn.Linear(64, VOCAB)

            def forward(self, ids, labels):
                logits = self.out(torch.relu(self.hidden(self.embed(ids))))
                return {"loss": torch.nn.functional.cross_entropy(
                    logits.flatten(0, 1), labels.flatten())}

        return Mlp()


def _model(name: str):
    import torch

    torch.manual_seed(0)
    if name == "seqcls":
        import transformers

        from zoo.compile_models import VOCAB

        config = transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32, bos_token_id=0,
            eos_token_id=0, pad_token_id=0, num_labels=2, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0)
        model = transformers.GPT2ForSequenceClassification(config)
    elif name == "mlp":
        model = _Mlp.build()
    else:
        from zoo.compile_models import gpt2

        model, _ = gpt2()
    model.train()
    return model


def _batch(world: int, name: str):
    """The global batch: token ids and their labels (the ids themselves,
    or one class a sequence for ``seqcls``)."""
    import torch

    from zoo.compile_models import VOCAB

    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH_PER_RANK * world, SEQ), generator=generator)
    if name != "seqcls":
        return ids, ids
    ids[::2, SEQ - 2:] = 0  # right padding: the last non-pad token is not the last one
    return ids, torch.arange(BATCH_PER_RANK * world) % 2


def _steps(model, batch, steps: int, reduce=None) -> tuple[list[float], float]:
    import torch

    ids, labels = batch
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, first = [], 0.0
    start = time.perf_counter()
    for step in range(steps):
        optimizer.zero_grad()
        out = model(ids, labels=labels)
        loss = out["loss"]
        COMPILED_NODES[:] = _compiled_nodes(loss)
        loss.backward()
        optimizer.step()
        value = loss.detach().clone()
        if reduce is not None:
            value = reduce(value)
        losses.append(float(value))
        if step == 0:
            first = time.perf_counter() - start
    return losses, first


def _compiled_nodes(loss) -> list[str]:
    """The compiled graphs' nodes in the autograd graph of ``loss``, by
    class name: one per piece of a graph cut at DDP's buckets."""
    seen, todo = set(), [loss.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and node not in seen:
            seen.add(node)
            todo += [next_node for next_node, _ in node.next_functions]
    return sorted(type(node).__name__ for node in seen
                  if type(node).__name__ in ("_JointBackward", "CompiledFunctionBackward"))


COMPILED_NODES: list[str] = []


def _farthest(model, other) -> float:
    """The largest difference between two models' parameters."""
    return max(float((p - q).abs().max())
               for p, q in zip(model.parameters(), other.parameters(), strict=True))




def main(argv: list[str] | None = None) -> NoReturn:
    parser = argparse.ArgumentParser()
    parser.add_argument("order", choices=("ddp_of_compiled", "compiled_ddp",
                                          "torch_compile_ddp", "inductor_ddp"))
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--model", choices=("gpt2", "seqcls", "mlp"), default="gpt2")
    parser.add_argument("--hang-after", type=float, default=240.0)
    parser.add_argument("--bucket-mb", type=float, default=None, help="DDP's bucket_cap_mb")
    options = parser.parse_args(argv)

    # A rank that hangs (a collective the other rank never joins) prints
    # every thread's stack and exits, instead of holding the test to its timeout.
    faulthandler.dump_traceback_later(options.hang_after, exit=True)

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ltc_cache
    from tools.probes import AOT, count_aot_traces, program_logs

    count_aot_traces()
    visited, captured = dynamo_frames()
    logs = program_logs()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    model = _model(options.model)
    reference_model = copy.deepcopy(model) if rank == 0 else None
    eager_model = copy.deepcopy(model)
    batch = _batch(world, options.model)
    mine = tuple(t[rank * BATCH_PER_RANK:(rank + 1) * BATCH_PER_RANK] for t in batch)

    buckets = {"bucket_cap_mb": options.bucket_mb}
    if options.order == "ddp_of_compiled":
        net = DDP(ltc_cache.compile(model), **buckets)
    elif options.order == "compiled_ddp":
        net = ltc_cache.compile(DDP(model, **buckets))
    elif options.order == "torch_compile_ddp":
        net = torch.compile(DDP(model, **buckets), backend="ltc_cache")
    else:  # for the benchmark: Inductor
        net = torch.compile(DDP(model, **buckets))

    def global_mean(value):
        dist.all_reduce(value)
        return value / world

    losses, first = _steps(net, mine, options.steps, global_mean)
    result = {"rank": rank, "world": world, "order": options.order, "losses": losses,
              "first_step_s": first, "stats": ltc_cache.stats(),
              "frames_ok": int(torch._dynamo.utils.counters["frames"]["ok"]),
              "aot_traces": AOT["traces"], "logs": logs,
              "visited": visited,
              "captures": len(captured), "compiled_nodes": list(COMPILED_NODES)}
    # The weights after the steps: the same on every rank (a digest), and
    # as far from eager DDP's (the same steps, every rank) and from the
    # reference's as the all-reduced gradients allow.
    result["weights"] = hashlib.sha256(b"".join(
        p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    eager = DDP(eager_model, **buckets)
    result["eager_ddp"], _ = _steps(eager, mine, options.steps, global_mean)
    result["eager_ddp_weights_error"] = _farthest(model, eager_model)
    del eager
    if reference_model is not None:
        result["reference"], _ = _steps(reference_model, batch, options.steps)
        result["weights_error"] = _farthest(model, reference_model)
    Path(options.out, f"rank{rank}.json").write_text(json.dumps(result))
    # DDP's reducer goes before the process group it talks through.
    del net, model
    dist.barrier()
    dist.destroy_process_group()
    exit_skipping_teardown()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
