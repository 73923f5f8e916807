"""Train a small causal transformer through ltc_cache.compile.

    LTC_CACHE_DIR=/tmp/ltc python examples/train.py [--steps 300] [--no-eager]
        [--compile torch]

Synthetic data: sequences of a repeating random pattern, so the loss falls.
The first run captures the model's program, traces the forward and backward
graphs with LTC and stores them; run it again and it starts warm (no Dynamo
capture, no AOTAutograd, no traces) with the same losses. ``--compile torch`` uses
``torch.compile(model, backend="ltc_cache")`` instead (Dynamo captures in
every run). The same steps in eager PyTorch, in this process, give the
reference losses.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import time

import torch
from torch import nn

import ltc_cache

VOCAB, WIDTH, HEADS, LAYERS, SEQ, BATCH = 64, 64, 4, 2, 16, 8


class TinyLM(nn.Module):
    """Token and position embeddings, a causal TransformerEncoder, an LM head."""

    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Embedding(SEQ, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, HEADS, 2 * WIDTH, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, VOCAB)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(SEQ))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.tokens(ids) + self.positions(positions)
        x = self.encoder(x, mask=self.causal, is_causal=True)
        return self.head(x)


def batches(steps: int) -> list[torch.Tensor]:
    """Each row repeats a random pattern of length 2 to 5."""
    generator = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        rows = []
        for _ in range(BATCH):
            period = int(torch.randint(2, 6, (1,), generator=generator))
            pattern = torch.randint(0, VOCAB, (period,), generator=generator)
            rows.append(pattern.repeat(math.ceil((SEQ + 1) / period))[: SEQ + 1])
        out.append(torch.stack(rows))
    return out


def train(model: nn.Module, data: list[torch.Tensor]) -> tuple[list[float], float]:
    """Losses per step, and the seconds to the first loss (compile included)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses: list[float] = []
    start = time.perf_counter()
    first = 0.0
    for batch in data:
        inputs, targets = batch[:, :-1], batch[:, 1:]
        optimizer.zero_grad()
        logits = model(inputs)
        loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if len(losses) == 1:
            first = time.perf_counter() - start
    return losses, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--no-eager", action="store_true",
                        help="skip the eager reference run")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--compile", choices=("ltc_cache", "torch"), default="ltc_cache",
                        help="ltc_cache.compile (default) or torch.compile(backend=ltc_cache)")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = TinyLM()
    reference = copy.deepcopy(model)
    data = batches(args.steps)

    start = time.perf_counter()
    compiled = (ltc_cache.compile(model) if args.compile == "ltc_cache"
                else torch.compile(model, backend="ltc_cache"))
    losses, first = train(compiled, data)
    total = time.perf_counter() - start
    stats = ltc_cache.stats()
    report = {
        "steps": args.steps,
        "first_step_s": round(first, 3),
        "total_s": round(total, 3),
        "first_loss": losses[0],
        "last_loss": losses[-1],
        # Equal digests: bit-identical losses in two runs.
        "loss_digest": hashlib.sha256(json.dumps(losses).encode()).hexdigest()[:16],
        "losses": losses,
        "hits": stats["hits"],
        "misses": stats["misses"],
        "traces": stats["traces"],
        "aot_traces": stats.get("aot_traces", 0),
        "program_hits": stats.get("program_hits", 0),
        "frames_captured": int(torch._dynamo.utils.counters["frames"]["ok"]),
        "ltc_op_share": round(stats.get("ltc_ops", 0) / max(stats.get("aten_ops", 0), 1), 3),
    }
    if not args.no_eager:
        eager, _ = train(reference, data)
        report["max_relative_diff_vs_eager"] = max(
            abs(a - b) / abs(b) for a, b in zip(losses, eager, strict=True))
    if args.json:
        print(json.dumps(report))
        return
    warm = "warm: no traces" if stats["traces"] == 0 else f"cold: {stats['traces']} traces"
    if report["program_hits"]:
        warm += ", program loaded, no Dynamo capture"
    if stats["traces"] == 0 and report["aot_traces"] == 0:
        warm += ", no AOTAutograd"
    print(f"{args.steps} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f} ({warm})")
    print(f"first step (compile included) {first:.2f} s, all steps {total:.2f} s")
    print(f"cache: {stats['hits']} hits, {stats['misses']} misses, {stats['traces']} traces; "
          f"{report['ltc_op_share']:.0%} of aten ops in LTC")
    print(f"loss digest {report['loss_digest']}")
    if "max_relative_diff_vs_eager" in report:
        print(f"largest relative difference from eager: "
              f"{report['max_relative_diff_vs_eager']:.2e}")


if __name__ == "__main__":
    main()
