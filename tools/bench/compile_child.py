"""The measured side of ``python -m tools.bench.compile``: what each fresh
child process runs (``--child MODEL BACKEND``), printing its report as one
JSON line for the driver in tools/bench/compile.py."""

from __future__ import annotations

import json
import resource
import statistics
import time


def train_child(model_name: str, backend: str) -> dict:
    """One model in train(): the first AdamW step through torch.compile,
    then steady steps, and the same steps in eager on a copy."""
    import copy

    import torch

    from zoo.compile_models import MODELS as BUILDERS
    from zoo.compile_models import loss_of

    torch.manual_seed(0)
    model, args = BUILDERS[model_name]()
    model.train()
    reference = copy.deepcopy(model)

    def step(module, optimizer):
        optimizer.zero_grad()
        loss = loss_of(module(*args))
        loss.backward()
        optimizer.step()
        return loss.item()

    compiled = torch.compile(model, backend=backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cpu = time.process_time()
    start = time.perf_counter()
    got = step(compiled, optimizer)
    first = time.perf_counter() - start
    first_cpu = time.process_time() - cpu
    steady = []
    for _ in range(10):
        start = time.perf_counter()
        step(compiled, optimizer)
        steady.append(time.perf_counter() - start)
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    want = step(reference, reference_optimizer)
    eager = []
    for _ in range(10):
        start = time.perf_counter()
        step(reference, reference_optimizer)
        eager.append(time.perf_counter() - start)
    return {
        "first_s": first,
        "first_cpu_s": first_cpu,
        "steady_ms": statistics.median(steady) * 1e3,
        "eager_ms": statistics.median(eager) * 1e3,
        "max_error": abs(got - want) / abs(want),  # relative, of the first loss
    }


def child(model_name: str, backend: str, train: bool = False) -> None:
    """Build one model, compile it, time its first call and steady calls."""
    import torch

    torch.set_num_threads(1)
    if train:
        report = train_child(model_name, backend)
        add_ltc_stats(report, backend)
        print(json.dumps(report))
        return
    from zoo.compile_models import MODELS as BUILDERS
    from zoo.compile_models import first_tensor

    torch.manual_seed(0)
    model, args = BUILDERS[model_name]()
    model.eval()
    with torch.no_grad():
        want = first_tensor(model(*args))
        compiled = torch.compile(model, backend=backend)
        cpu = time.process_time()
        start = time.perf_counter()
        got = first_tensor(compiled(*args))
        first = time.perf_counter() - start
        first_cpu = time.process_time() - cpu
        steady = []
        for _ in range(20):
            start = time.perf_counter()
            compiled(*args)
            steady.append(time.perf_counter() - start)
        eager = []
        for _ in range(20):
            start = time.perf_counter()
            model(*args)
            eager.append(time.perf_counter() - start)
    report = {
        "first_s": first,
        "first_cpu_s": first_cpu,
        "steady_ms": statistics.median(steady) * 1e3,
        "eager_ms": statistics.median(eager) * 1e3,
        "max_error": (got - want).abs().max().item(),
    }
    add_ltc_stats(report, backend)
    print(json.dumps(report))


def add_ltc_stats(report: dict, backend: str) -> None:
    if backend == "ltc_cache":
        import ltc_cache

        stats = ltc_cache.stats()
        report["traces"] = stats["traces"]
        report["hits"] = stats["hits"]
        report["aot_traces"] = stats.get("aot_traces", 0)
        report["ltc_share"] = stats.get("ltc_ops", 0) / max(stats.get("aten_ops", 0), 1)


def program_child(model_name: str, mode: str, train: bool) -> None:
    """``--program``: one model's first call (or training step) through
    ``ltc_cache.compile`` (``mode`` program) or ``torch.compile`` with
    ``mode`` as its backend, against eager on a copy."""
    import copy

    import torch

    import ltc_cache
    from zoo.compile_models import MODELS as BUILDERS
    from zoo.compile_models import first_tensor, loss_of

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, args = BUILDERS[model_name]()
    model.train(train)
    reference = copy.deepcopy(model)
    compiled = (ltc_cache.compile(model) if mode == "program"
                else torch.compile(model, backend=mode))
    if train:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        start = time.perf_counter()
        optimizer.zero_grad()
        got = loss_of(compiled(*args))
        got.backward()
        optimizer.step()
        first = time.perf_counter() - start
        want = loss_of(reference(*args))
        error = abs(got.item() - want.item()) / max(abs(want.item()), 1e-12)
    else:
        with torch.no_grad():
            start = time.perf_counter()
            got = first_tensor(compiled(*args))
            first = time.perf_counter() - start
            error = (got - first_tensor(reference(*args))).abs().max().item()
    stats = ltc_cache.stats()
    print(json.dumps({
        "first_s": first,
        "max_error": error,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "frames": int(torch._dynamo.utils.counters["frames"]["ok"]),
        "traces": stats["traces"],
        "program_hits": stats.get("program_hits", 0),
        "fallbacks": stats.get("program_fallbacks", 0),
    }))
