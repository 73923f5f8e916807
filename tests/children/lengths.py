"""A training loop over batches of varying sequence lengths, as transformers'
dynamic padding makes them, through ``ltc_cache.compile`` and eagerly.

``python tests/children/lengths.py --lengths 9,40 [--model gpt2|llama]
[--route ltc_cache|inductor|eager] [--no-mask]`` prints one JSON line: each step's
loss through the route (``ltc_cache.compile(model)``, ``torch.compile(model)``)
and eagerly, each step's time, the process's time to the end of its
last step, and its counters. The models and batches are
``zoo/padded_models.py``'s; ``--no-mask``: without their ``attention_mask``
(a causal LM fed from a token stream: ``input_ids`` and ``labels``).
``tests/program/test_buckets.py`` and ``python -m tools.bench.generate --train``
run it in fresh processes, cold then warm.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from zoo.padded_models import batch, build


def train(model: torch.nn.Module, call: Callable[..., Any], lengths: list[int],
          mask: bool = True) -> tuple[list[float], list[float]]:
    """AdamW steps, one batch of each length (``mask``: with its attention
    mask): the losses and step times."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, seconds = [], []
    for step, length in enumerate(lengths):
        start = time.perf_counter()
        inputs = batch(length, step)
        if not mask:
            del inputs["attention_mask"]
        out = call(**inputs)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        seconds.append(time.perf_counter() - start)
        losses.append(out.loss.item())
        assert out.logits.shape[1] == length, out.logits.shape  # cut back to the batch's
    return losses, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", required=True, help="one batch of each length, in order")
    parser.add_argument("--model", default="gpt2", choices=("gpt2", "llama"))
    parser.add_argument("--route", default="ltc_cache", choices=("ltc_cache", "inductor", "eager"))
    parser.add_argument("--started", type=float, help="the parent's time.time() at the start")
    parser.add_argument("--no-check", action="store_true", help="skip eager's losses")
    parser.add_argument("--no-mask", action="store_true", help="batches without attention_mask")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # transformers' config notes
    lengths = [int(n) for n in args.lengths.split(",")]

    import ltc_cache

    model = build(args.model)
    compiled = {"ltc_cache": ltc_cache.compile, "inductor": torch.compile,
                "eager": lambda m: m}[args.route](model)
    losses, seconds = train(model, compiled, lengths, not args.no_mask)
    process_s = time.time() - args.started if args.started else None  # eager's run not in it
    from torch._dynamo.utils import counters

    stats, frames = ltc_cache.stats(), counters["frames"].get("ok", 0)
    eager = None if args.no_check else \
        train(model := build(args.model), model, lengths, not args.no_mask)[0]
    print(json.dumps({"losses": losses, "eager": eager, "seconds": seconds,
                      "process_s": process_s, "stats": stats, "frames": frames}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
