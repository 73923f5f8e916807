"""A separate process for the fused tier's tests, in the cache configured by
LTC_CACHE_* (LTC_CACHE_FUSE among them): first each corner case named on
the command line (zoo/corner_models.py) through
``ltc_cache.extract_compiled_graph``, checked against eager; then three
AdamW steps of a small MLP through ``ltc_cache.compile`` (a forward and a
backward region), against the same steps in eager.

``python tests/children/fused.py [CASE ...]`` prints one JSON object: this
process's stats after the corner cases (``graphs``) and at the end
(``stats``), each case's failure, and the largest relative difference of
the losses."""

from __future__ import annotations

import copy
import json
import sys

import torch
from helpers import mse_steps
from torch import nn

import ltc_cache
from zoo.corner_models import build, check_against_eager, random_inputs


def run_train() -> float:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    reference = copy.deepcopy(model)
    compiled = ltc_cache.compile(model)
    losses = []
    for m in (compiled, reference):
        optimizer = torch.optim.AdamW(m.parameters() if m is reference else model.parameters())
        losses.append([loss.item() for loss in mse_steps(m, optimizer)])
    return max(abs(a - b) / abs(b) for a, b in zip(*losses, strict=True))


def run_cases(names: list[str]) -> dict[str, str]:
    """Extract each corner case and check it against eager; name -> failure."""
    failures = {}
    for name in names:
        gm, shapes = build(name)
        try:
            compiled = ltc_cache.extract_compiled_graph(gm, random_inputs(shapes, seed=1))
            check_against_eager(gm, compiled, shapes)
        except Exception as exc:
            failures[name] = f"{type(exc).__name__}: {exc}"
    return failures


if __name__ == "__main__":
    failures = run_cases(sys.argv[1:])
    graphs = ltc_cache.stats()
    error = run_train()
    print(json.dumps({"graphs": graphs, "stats": ltc_cache.stats(), "failures": failures,
                      "error": error}))
