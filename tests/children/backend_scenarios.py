"""A child process that runs scenarios of models through
``backend="ltc_cache"`` and counts AOTAutograd's traces on its own
(``tools/probes.py``), without ltc_cache's counters.

``python tests/children/backend_scenarios.py SCENARIO MODEL [MODEL ...] [--lengths 16,24]``
prints one JSON line, for each model (run one after the other, the counts
reset before each, as a process of its own would count them): ``aot`` (calls
of AOTAutograd's graph capture, wrapped before torch.compile runs), the
losses or outputs of the compiled model and of eager in this process,
ltc_cache's counters and warnings.

Scenarios:

- ``train``: five AdamW steps, one more whose output is scaled in place,
  then ``eval()`` and an inference, ``train()`` again with one parameter
  frozen, ``load_state_dict`` of the first weights and two more steps;
  eager does the same on a copy.
- ``infer``: inference under no_grad (partitioned where the graph needs it).
- ``dynamic``: inference with ``dynamic=True`` over the sequence lengths
  given, in that order.
- ``automatic``: inference without ``dynamic``, over the lengths given
  (Dynamo's automatic dynamic shapes mark the length dynamic after the
  second one).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import sys

import torch
from helpers import ltc_cache_warnings

from tools.probes import AOT, count_aot_traces
from zoo.compile_models import MODELS, VOCAB, first_tensor, loss_of, train_steps


def digest(values: list[float]) -> str:
    return hashlib.sha256(json.dumps(values).encode()).hexdigest()[:16]


def session(model, args) -> list[float]:
    """The training scenario; the same calls for eager and compiled."""
    torch.manual_seed(1)  # the same dropout masks, where the model drops
    first_weights = copy.deepcopy(model.state_dict())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    values = train_steps(model, args, 5, optimizer)
    # The output changed in place before backward: allowed in eager, so
    # compiled too (an output that views an intermediate is handed back
    # as no view, as AOTAutograd does).
    optimizer.zero_grad()
    out = first_tensor(model(*args))
    out.mul_(0.5)
    loss = (out.float() ** 2).mean()
    loss.backward()
    optimizer.step()
    values.append(loss.item())
    model.eval()
    with torch.no_grad():
        values.append(loss_of(model(*args)).item())
    model.train()
    frozen = next(p for n, p in model.named_parameters() if "bias" in n or "norm" in n)
    frozen.requires_grad_(False)
    values += train_steps(model, args, 2, optimizer)
    values.append(float(frozen.grad is None))  # no gradient for the frozen one, as in eager
    frozen.requires_grad_(True)
    model.load_state_dict(first_weights)
    values += train_steps(model, args, 2, torch.optim.AdamW(model.parameters(), lr=1e-3))
    return values


def ids(length: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(length))


def run(scenario: str, model_name: str, lengths: list[int]) -> dict:
    import ltc_cache
    from ltc_cache.diagnostics import counters

    AOT["traces"] = 0
    counters.reset()
    torch.manual_seed(0)
    model, args = MODELS[model_name]()
    reference = copy.deepcopy(model)
    result: dict = {}
    if scenario == "train":
        model.train()
        reference.train()
        result["eager"] = session(reference, args)
        result["got"] = session(torch.compile(model, backend="ltc_cache"), args)
    else:
        model.eval()
        reference.eval()
        dynamic = True if scenario == "dynamic" else None
        compiled = torch.compile(model, backend="ltc_cache", dynamic=dynamic)
        inputs = [args] if scenario == "infer" else [(ids(n),) for n in lengths]
        got, want = [], []
        with torch.no_grad():
            for x in inputs:
                got.append(first_tensor(compiled(*x)))
                want.append(first_tensor(reference(*x)))
        result["max_error"] = max((g - w).abs().max().item()
                                  for g, w in zip(got, want, strict=True))
        result["got"] = [t.sum().item() for t in got]
    result["digest"] = digest(result["got"])
    result["aot"] = AOT["traces"]
    result["stats"] = ltc_cache.stats()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=["train", "infer", "dynamic", "automatic"])
    parser.add_argument("models", nargs="+", choices=sorted(MODELS), metavar="MODEL")
    parser.add_argument("--lengths", default="8")
    options = parser.parse_args(argv)
    count_aot_traces()
    results = {}
    for name in options.models:
        with ltc_cache_warnings() as warned:
            result = run(options.scenario, name, [int(n) for n in options.lengths.split(",")])
        result["warnings"] = warned
        results[name] = result
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
