"""A user's ``train.py``, as ``tools.bench.first_run`` runs it in fresh
processes: the small GPT of zoo/small_gpt.py (or GPT-2 small's shape)
trained with AdamW for ``--steps`` iterations, eagerly, through Inductor
(``torch.compile``) or through ``ltc_cache.compile``, at torch's default
thread count. Prints one JSON line: when each iteration ended, as seconds
since the process started (its start time from /proc), and the losses.

    python -m tools.bench.first_run_child --compile ltc --steps 40 [--model gpt2-small]
"""

from __future__ import annotations

import argparse
import json
import os
import time


def process_start() -> float:
    """This process's start as a ``time.time()`` (Linux: /proc/self/stat's
    start time; elsewhere, now)."""
    try:
        with open("/proc/self/stat") as stat:
            ticks = int(stat.read().rpartition(")")[2].split()[19])
        with open("/proc/uptime") as uptime:
            up = float(uptime.read().split()[0])
        return time.time() - up + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


def main() -> None:
    started = process_start()
    parser = argparse.ArgumentParser()
    parser.add_argument("--compile", choices=["eager", "inductor", "ltc"], required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--model", choices=["small-gpt", "gpt2-small"], default="small-gpt")
    args = parser.parse_args()

    import torch
    from torch.nn import functional as F

    from zoo.small_gpt import BATCH, SEQUENCE, VOCAB, SmallGPT

    torch.manual_seed(0)
    if args.model == "gpt2-small":  # 124M parameters, random weights: no download
        import transformers

        transformers.logging.set_verbosity_error()
        config = transformers.GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257,
                                         n_positions=1024, resid_pdrop=0.0, embd_pdrop=0.0,
                                         attn_pdrop=0.0)
        model, vocab, sequence, batch = transformers.GPT2LMHeadModel(config), 50257, 256, 4
    else:
        model, vocab, sequence, batch = SmallGPT(), VOCAB, SEQUENCE, BATCH
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if args.compile == "inductor":
        model = torch.compile(model)
    elif args.compile == "ltc":
        import ltc_cache

        model = ltc_cache.compile(model)
    generator = torch.Generator().manual_seed(1)
    data = torch.randint(0, vocab, (args.steps, batch, sequence + 1), generator=generator)
    ended, losses = [], []
    for step in range(args.steps):
        x, y = data[step, :, :-1], data[step, :, 1:]
        logits = model(x)[0]
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        ended.append(time.time() - started)
    print(json.dumps({"ended": ended, "losses": losses, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
