"""The measured side of ``python -m tools.bench.suite``: one model and mode
in a fresh child process (``--child MODEL MODE``), its report one JSON line
for the driver in tools/bench/suite.py (tests/children/suite.py runs it too)."""

from __future__ import annotations

import time


def _regions(lines: list[str]) -> int:
    """LTC regions over the graphs this process compiled, from the backend's
    per-graph log lines ("... in N LTC regions")."""
    total = 0
    for line in lines:
        if " LTC regions" in line:
            total += int(line.split(" LTC regions")[0].rsplit(" ", 1)[1])
    return total


def _buffer_error(model, eager) -> float:
    """How far the buffers after the step (BatchNorm's running statistics,
    updated in the graph) are from eager's: for floating buffers, relative
    to the largest of each, or absolute below 1 (a running mean of ~1e-9 is
    rounding, not a scale); any integer buffer that differs (a count of
    batches) is infinitely far."""
    worst = 0.0
    for got, want in zip(model.buffers(), eager.buffers(), strict=True):
        if not want.is_floating_point():
            worst = max(worst, 0.0 if bool((got == want).all()) else float("inf"))
        elif want.numel():
            scale = max(want.abs().max().item(), 1.0)
            worst = max(worst, (got - want).abs().max().item() / scale)
    return worst


MICRO_BATCHES = 4  # mode ckpt: micro-batches accumulated into one step


def checkpointing_on(model) -> bool:
    """transformers' gradient checkpointing, non-reentrant (what
    ``TrainingArguments(gradient_checkpointing=True)`` asks for); False for
    a model that has none."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        return False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return True


def accumulated_step(model, run, inputs: dict, loss_of) -> tuple[list[float], dict, float]:
    """One optimizer step of ``run`` (``model``, or what compiles it):
    MICRO_BATCHES forward and backward passes accumulated, then AdamW.
    Returns the losses, the gradients before the optimizer step, and the
    process CPU seconds of the step (the gradients' copies left out)."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cpu = time.process_time()
    losses = []
    for _ in range(MICRO_BATCHES):
        loss = loss_of(run(**inputs)) / MICRO_BATCHES
        loss.backward()
        losses.append(loss.item())
    spent = time.process_time() - cpu
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    cpu = time.process_time()
    optimizer.step()
    optimizer.zero_grad()
    return losses, grads, spent + time.process_time() - cpu


def varied_lengths(model, eager, inputs: dict, seed: int) -> dict:
    """Mode ``lengths``: ten AdamW steps through ``ltc_cache.compile``, one
    batch of each of ten lengths drawn with ``seed``, then the same steps
    eagerly on ``eager``: each step's seconds and the largest difference
    of a loss from eager's."""
    import torch

    import ltc_cache
    from zoo import suite_models
    from zoo.padded_models import train_lengths

    lengths = train_lengths(seed)
    batches = [suite_models.at_length(model, inputs, n, step) for step, n in enumerate(lengths)]
    if batches[0] is None:
        raise SystemExit("not a text model (its inputs are more than token ids)")

    def steps(run, module) -> tuple[list[float], list[float]]:
        optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
        losses, seconds = [], []
        for batch in batches:
            start = time.perf_counter()
            loss = suite_models.loss_of(run(**batch))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            seconds.append(time.perf_counter() - start)
            losses.append(loss.item())
        return losses, seconds

    losses, seconds = steps(ltc_cache.compile(model), model)
    wanted, _ = steps(eager, eager)
    error = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, wanted, strict=True))
    return {"lengths": lengths, "seconds": seconds, "error": error}


def child(name: str, mode: str, backend: str = "ltc_cache", lengths_seed: int = 1) -> dict:
    import copy
    import logging
    import warnings

    import torch

    import ltc_cache
    from tools.probes import count_aot_traces  # AOTAutograd's traces, counted apart
    from zoo import suite_models

    torch.set_num_threads(1)
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("ltc_cache")
    logger.setLevel(logging.INFO)
    logger.addHandler(Collect())
    count_aot_traces()
    torch.manual_seed(0)
    model, inputs = suite_models.build(name)
    train = mode in ("train", "ckpt")
    model.train(train or mode == "lengths")
    result: dict = {"model": name, "mode": mode}
    if mode == "ckpt" and not checkpointing_on(model):
        raise SystemExit(f"{name} has no gradient checkpointing")
    eager = copy.deepcopy(model)
    if mode == "lengths":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result.update(varied_lengths(model, eager, inputs, lengths_seed))
        return {**result, **_what_it_did(lines, caught)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = ltc_cache.compile(model) if backend == "ltc_cache" else torch.compile(model)
        start, cpu = time.perf_counter(), time.process_time()
        if mode == "ckpt":
            losses, grads, _ = accumulated_step(model, compiled, inputs, suite_models.loss_of)
        elif train:
            loss = suite_models.loss_of(compiled(**inputs))
            loss.backward()
        else:
            with torch.no_grad():
                got = suite_models.main_output(compiled(**inputs))
        result["first_s"] = time.perf_counter() - start
        result["first_cpu_s"] = time.process_time() - cpu
    if mode == "ckpt":
        wanted_losses, wanted, _ = accumulated_step(eager, eager, inputs, suite_models.loss_of)
        scale = max((g.abs().max().item() for g in wanted.values()), default=1.0) or 1.0
        worst = max(((grads[n] - wanted[n]).abs().max().item() for n in wanted if n in grads),
                    default=0.0)
        result["error"] = max(worst / scale, *(abs(a - b) / max(abs(b), 1e-12)
                                               for a, b in zip(losses, wanted_losses,
                                                               strict=True)))
        result["missing_grads"] = sorted(set(wanted) ^ set(grads))
        result["buffer_error"] = _buffer_error(model, eager)
        with warnings.catch_warnings(record=True) as more:  # the next step: steady calls
            warnings.simplefilter("always")
            result["second_cpu_s"] = accumulated_step(model, compiled, inputs,
                                                      suite_models.loss_of)[2]
        caught += more
    elif train:
        want = suite_models.loss_of(eager(**inputs))
        want.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        wanted = {n: p.grad for n, p in eager.named_parameters() if p.grad is not None}
        scale = max((g.abs().max().item() for g in wanted.values()), default=1.0) or 1.0
        missing = set(wanted) ^ set(grads)
        worst = max((((grads[n] - wanted[n]).abs().max().item()) for n in wanted if n in grads),
                    default=0.0)
        result["error"] = max(worst / scale,
                              abs(loss.item() - want.item()) / max(abs(want.item()), 1e-12))
        result["missing_grads"] = sorted(missing)
        result["buffer_error"] = _buffer_error(model, eager)
    else:
        with torch.no_grad():
            want = suite_models.main_output(eager(**inputs))
        scale = want.abs().max().item() or 1.0
        result["error"] = (got - want).abs().max().item() / scale
    return {**result, **_what_it_did(lines, caught)}


def _what_it_did(lines: list[str], caught: list) -> dict:
    """What a child process traced and captured, and what it logged."""
    import torch

    import ltc_cache
    from tools.probes import AOT

    return {"stats": ltc_cache.stats(), "aot": AOT["traces"],
            "frames": sum(torch._dynamo.utils.counters["frames"].values()),
            "regions": _regions(lines),
            "warnings": [str(w.message)[:300] for w in caught if "ltc_cache" in str(w.message)],
            "misses": [line for line in lines if line.startswith("miss")][:5],
            "program_log": [line[:300] for line in lines if "program" in line][:5]}
