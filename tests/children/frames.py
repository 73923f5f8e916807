"""A child process for the several-frames program tests (``test_frames.py``):
trains a model through ``ltc_cache.compile`` and a copy eagerly, counting
Dynamo's frames and AOTAutograd's traces on its own.

``python tests/children/frames.py MODEL [--models DIR] [--steps N] [--set NAME=X [--set-at STEP]]``

``MODEL`` is ``gpt2`` (transformers' GPT-2, 2 layers, in ``train()``: its
forward breaks the graph) or a builder of ``DIR/framemodels.py`` (DIR on the
child's PYTHONPATH: the launching test puts it there). ``--set``
rebinds a global of that module before the first call (``--set-at``: before
that step). Prints one JSON
line: both runs' losses, the largest gradient difference, the counters and
what ``ltc_cache.program.precompile`` logged.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import sys
import warnings


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _build(options: argparse.Namespace):
    import torch

    if options.model == "gpt2":
        from zoo.compile_models import gpt2

        torch.manual_seed(0)
        model, (ids,) = gpt2()
        # labels=: the loss inside the model, whose first use logs a warning
        # through logging.Logger, which Dynamo breaks the graph at.
        return model, (ids,), {"labels": ids}
    import framemodels  # from --models, which the launcher put on PYTHONPATH

    if options.set and options.set_at == 0:
        _rebind(framemodels, options.set)
    torch.manual_seed(0)
    model = getattr(framemodels, options.model)()
    # A positive input: with the sign alternating, even steps take a branch
    # on x.sum() > 0, odd steps the other.
    return model, (torch.randn(4, 16).abs() + 0.1,), {}


def _rebind(module, assignment: str) -> None:
    """NAME=FLOAT, or NAME=OTHER (another global of the module)."""
    name, value = assignment.split("=")
    setattr(module, name, getattr(module, value) if hasattr(module, value) else float(value))


def _loss(out):
    if getattr(out, "loss", None) is not None:
        return out.loss
    return (out.float() ** 2).mean()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--models", default=".")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--set", default=None)
    parser.add_argument("--set-at", type=int, default=0,
                        help="the step before which --set rebinds (0: before building)")
    options = parser.parse_args(argv)

    collect = _Collect()
    logger = logging.getLogger("ltc_cache.precompile")
    logger.setLevel(logging.INFO)
    logger.addHandler(collect)

    import torch

    import ltc_cache
    from tools.probes import AOT, count_aot_traces

    count_aot_traces()
    model, args, kwargs = _build(options)
    model.train()
    eager = copy.deepcopy(model)
    compiled = ltc_cache.compile(model)
    result: dict = {"losses": [], "eager": [], "grad_error": 0.0}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(options.steps):
            if options.set and options.set_at == step > 0:
                _rebind(sys.modules["framemodels"], options.set)
            # Alternate the sign so a data-dependent branch takes both ways.
            call = tuple(a * (-1) ** step if a.is_floating_point() else a for a in args)
            for net, losses in ((compiled, result["losses"]), (eager, result["eager"])):
                net.zero_grad()
                loss = _loss(net(*call, **kwargs))
                loss.backward()
                losses.append(loss.item())
            errors = [(p.grad - q.grad).abs().max().item()
                      for p, q in zip(model.parameters(), eager.parameters(), strict=True)
                      if p.grad is not None]
            result["grad_error"] = max(result["grad_error"], *errors)
    result["stats"] = ltc_cache.stats()
    result["frames_ok"] = int(torch._dynamo.utils.counters["frames"]["ok"])
    result["aot_traces"] = AOT["traces"]
    result["logs"] = collect.lines
    result["warnings"] = [str(w.message) for w in caught if "ltc_cache" in str(w.message)]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
