"""A separate process for the tests of whole-plan libraries, in the cache
configured by LTC_CACHE_* (LTC_CACHE_FUSE among them): a partitioned
inference graph through ``torch.compile(backend="ltc_cache")`` and three
SGD steps of the same model through ``ltc_cache.compile`` (a training
plan: forward and backward), each against eager. ``sign``, which LTC does
not lower, splits each graph into regions with an eager op between them,
a running mean kept in a buffer (as BatchNorm's) makes each graph write
one of its inputs, and a checkpointed attention puts AOTAutograd's
generator-state wrappers into the training plan
(docs/torch/aot-autograd.md#checkpointing-adds-hop-and-rng-wrappers).

``python tests/children/fused_plan.py`` prints one JSON object: this
process's stats, and the largest relative difference from eager of the
inference outputs (``infer_error``, over three calls) and of the training
losses, weights and buffers (``train_error``)."""

from __future__ import annotations

import copy
import json

import torch
from helpers import mse_steps
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

import ltc_cache


class SignedGradient(torch.autograd.Function):
    """Half its input, with a gradient through ``sign``: an eager op in the
    backward graph too (AOTAutograd saves the forward's own ``sign``)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * 0.5

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return grad * (0.5 + 0.25 * torch.sign(x))


def attend(h: torch.Tensor) -> torch.Tensor:
    """Self-attention of the rows of ``h`` (8 x 32), two heads, no dropout:
    CPU's flash attention, which AOTAutograd wraps where it is recomputed."""
    heads = h.view(1, 8, 2, 16).transpose(1, 2)
    return F.scaled_dot_product_attention(heads, heads, heads).transpose(1, 2).reshape(8, 32)


class Signed(nn.Module):
    """Two linear layers around ``sign``: LTC regions, an eager op between
    (in the backward too: :class:`SignedGradient`);
    a running mean updated in place on every call, which the output reads:
    a write made twice, or not made, shows in outputs and buffers; an
    attention recomputed in the backward (activation checkpointing)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)
        self.register_buffer("running", torch.zeros(32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x))
        h = h + checkpoint(attend, h, use_reentrant=False)
        self.running.mul_(0.5).add_(h.detach().mean(0))
        return self.fc2(h * torch.sign(h) + SignedGradient.apply(h) + self.running)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def run_inference() -> float:
    torch.manual_seed(0)
    model = Signed().eval()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend="ltc_cache")
    worst = 0.0
    with torch.no_grad():
        for seed in range(3):
            x = torch.randn(8, 16, generator=torch.Generator().manual_seed(seed))
            worst = max(worst, relative(compiled(x), reference(x)),
                        relative(model.running, reference.running))
    return worst


def run_train() -> float:
    torch.manual_seed(1)
    model = Signed()
    reference = copy.deepcopy(model)
    compiled = ltc_cache.compile(model)
    losses: list[list[torch.Tensor]] = []
    for m, params in ((compiled, model.parameters()), (reference, reference.parameters())):
        losses.append(mse_steps(m, torch.optim.SGD(params, lr=0.1)))
    errors = [relative(a, b) for a, b in zip(*losses, strict=True)]
    errors += [relative(a.detach(), b.detach())
               for a, b in zip(model.state_dict().values(), reference.state_dict().values(),
                               strict=True)]
    return max(errors)


if __name__ == "__main__":
    infer_error = run_inference()
    train_error = run_train()
    print(json.dumps({"stats": ltc_cache.stats(), "infer_error": infer_error,
                      "train_error": train_error}))
