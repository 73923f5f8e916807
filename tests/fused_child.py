"""A separate process for the fused tier's tests: three AdamW steps of a
small MLP through ``ltc_cache.compile`` (a forward and a backward region)
in the cache configured by LTC_CACHE_* (LTC_CACHE_FUSE among them), against
the same steps in eager. Prints one JSON object: this process's stats and
the largest relative difference of the losses."""

from __future__ import annotations

import copy
import json

import torch
from torch import nn

import ltc_cache


def run_train() -> float:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    reference = copy.deepcopy(model)
    compiled = ltc_cache.compile(model)
    losses = []
    for m in (compiled, reference):
        optimizer = torch.optim.AdamW(m.parameters() if m is reference else model.parameters())
        run = []
        for step in range(3):
            g = torch.Generator().manual_seed(step)
            x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            run.append(loss.item())
        losses.append(run)
    return max(abs(a - b) / abs(b) for a, b in zip(*losses, strict=True))


if __name__ == "__main__":
    error = run_train()
    print(json.dumps({"stats": ltc_cache.stats(), "error": error}))
