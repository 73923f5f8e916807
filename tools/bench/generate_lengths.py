"""``python -m tools.bench.generate --forward`` and ``--train``: first calls
over sequence lengths a cold process met and a warm one did not, forward
(the ``--forward-worker`` child here) and training (tests/children/lengths.py
in fresh processes); their tables and lengths.json's rows."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tools.harness import (
    CHILDREN,
    child_env,
    cold_then_warm,
    ratio,
    run_child,
    seconds,
    tool_argv,
)
from tools.results import numbers
from zoo.padded_models import train_lengths

# --- --forward and --train -----------------------------------------------------


LENGTHS = (5, 8, 11, 14, 17, 20, 24, 29)
COMPILERS = ("program", "torch", "inductor")


def forward_worker(model_name: str, compiler: str, lengths: list[int]) -> dict[str, Any]:
    """``--forward``: one request (no_grad, batch 2) of each length, each
    first call timed."""
    import torch

    torch.set_num_threads(1)
    import ltc_cache
    from zoo.compile_models import MODELS, VOCAB, first_tensor

    torch.manual_seed(0)
    model, _ = MODELS[model_name]()
    model.eval()
    if compiler == "program":
        compiled = ltc_cache.compile(model)
    elif compiler == "torch":
        compiled = torch.compile(model, backend="ltc_cache")
    else:
        compiled = torch.compile(model)
    firsts, error = {}, 0.0
    with torch.no_grad():
        for length in lengths:
            generator = torch.Generator().manual_seed(length)
            ids = torch.randint(0, VOCAB, (2, length), generator=generator)
            want = first_tensor(model(ids))
            start = time.perf_counter()
            got = first_tensor(compiled(ids))
            firsts[length] = time.perf_counter() - start
            error = max(error, (got - want).abs().max().item())
    stats = ltc_cache.stats()
    return {"first_s": firsts, "max_error": error,
            "aot_traces": stats.get("aot_traces", 0), "traces": stats["traces"],
            "dynamo_graphs": stats.get("dynamo_graphs", 0)}


def forward_argv(model: str, compiler: str, lengths: list[int]) -> list[str]:
    return tool_argv("bench.generate", "--forward-worker", model, compiler,
                     ",".join(map(str, lengths)))


def measure_forward(models: list[str], compilers: list[str], lengths: list[int]) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-lengths-") as scratch:
        for model in models:
            for compiler in compilers:
                env = child_env(Path(tempfile.mkdtemp(prefix=f"{compiler}-", dir=scratch)))
                # The warm worker meets the lengths in reverse order.
                cold, warm = cold_then_warm(forward_argv(model, compiler, lengths), env,
                                            forward_argv(model, compiler, lengths[::-1]))
                rows.append({"model": model, "compiler": compiler, "cold": cold, "warm": warm})
                print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def forward_table(rows: list[dict], lengths: list[int]) -> str:
    lines = [
        "| model | compiler | length: cold / warm / warm÷cold ... | total cold | total warm "
        "| total warm/cold | worst warm/cold | warm AOTAutograd traces, LTC traces, "
        "Dynamo graphs | max error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cold, warm = r["cold"], r["warm"]
        if "failed" in cold or "failed" in warm:
            lines.append(f"| {r['model']} | {r['compiler']} | failed: "
                         f"{cold.get('failed') or warm.get('failed')} |")
            continue
        pairs = [(cold["first_s"][str(n)], warm["first_s"][str(n)]) for n in lengths]
        cells = " · ".join(f"{n}: {c:.2f}/{w:.2f}/{w / c:.2f}" for n, (c, w) in
                           zip(lengths, pairs, strict=True))
        total_cold, total_warm = sum(c for c, _ in pairs), sum(w for _, w in pairs)
        worst = max(w / c for c, w in pairs)
        lines.append(
            f"| {r['model']} | {r['compiler']} | {cells} | {seconds(total_cold)} "
            f"| {seconds(total_warm)} | {ratio(total_warm, total_cold)} | {worst:.2f} "
            f"| {warm['aot_traces']}, {warm['traces']}, {warm['dynamo_graphs']} "
            f"| {max(cold['max_error'], warm['max_error']):.1e} |")
    return "\n".join(lines)


COMPILER_LABELS = {"program": "`ltc_cache.compile`",
                   "torch": '`torch.compile(backend="ltc_cache")`',
                   "inductor": "Inductor (its caches on)"}


def forward_results(rows: list[dict], lengths: list[int]) -> dict:
    """lengths.json's ``first_requests`` table (one model): a compiler a row,
    a length a column of cold / warm / warm over cold seconds."""
    columns = [{"key": "compiler", "label": "compiler"}]
    columns += [{"key": f"len_{n}", "label": str(n), "format": ".2f", "join": "/"}
                for n in lengths]
    columns += [{"key": "total_warm_vs_cold", "label": "total warm / cold", "format": ".2f",
                 "bold": True},
                {"key": "warm_counts",
                 "label": "warm: AOTAutograd traces, LTC traces, Dynamo graphs",
                 "format": "d", "join": ", "}]
    out = []
    for r in rows:
        cold, warm = r["cold"], r["warm"]
        row: dict[str, Any] = {"compiler": COMPILER_LABELS.get(r["compiler"], r["compiler"])}
        if "failed" in cold or "failed" in warm:
            out.append({**row, **{c["key"]: None for c in columns[1:]}})
            continue
        for n in lengths:
            c, w = cold["first_s"][str(n)], warm["first_s"][str(n)]
            # A ratio of two figures that round to nothing says nothing.
            row[f"len_{n}"] = [round(c, 2), round(w, 2)] + (
                [round(w / c, 2)] if c >= 0.005 else [])
        total_cold = sum(cold["first_s"][str(n)] for n in lengths)
        total_warm = sum(warm["first_s"][str(n)] for n in lengths)
        row["total_warm_vs_cold"] = round(total_warm / total_cold, 2) if total_cold else None
        # Inductor's worker has no ltc_cache counters worth a cell.
        row["warm_counts"] = None if r["compiler"] == "inductor" else numbers(
            [warm.get("aot_traces"), warm.get("traces"), warm.get("dynamo_graphs")])
        out.append(row)
    return {"id": "first_requests", "columns": columns, "rows": out}


TRAIN_ROUTES = ("ltc_cache", "inductor", "eager")


def train_worker(model: str, route: str, lengths: list[int], env: dict[str, str]) -> dict:
    command = [sys.executable, str(CHILDREN / "lengths.py"), "--model", model,
               "--route", route, "--lengths", ",".join(map(str, lengths)),
               "--started", repr(time.time())]
    return run_child(command, env)


def train_table(models: list[str]) -> str:
    lines = [
        "| model | route | process | process start to last step | steps (sum) | first step "
        "| slowest later step | vs Inductor's warm run | captures / AOT / LTC traces "
        "| loss vs eager |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory(prefix="bench-train-lengths-") as scratch:
        for model in models:
            runs = {}
            for route in TRAIN_ROUTES:
                env = child_env(Path(tempfile.mkdtemp(prefix=f"{route}-", dir=scratch)))
                runs[route] = {start: train_worker(model, route, train_lengths(seed), env)
                               for start, seed in (("cold", 1), ("warm", 2))}
                print(json.dumps({route: runs[route]}), file=sys.stderr)
            inductor = runs["inductor"]["warm"].get("process_s")
            for route, starts in runs.items():
                for start, r in starts.items():
                    if "failed" in r:
                        lines.append(f"| {model} | {route} | {start} | failed: {r['failed']} |")
                        continue
                    s, stats = r["seconds"], r["stats"]
                    captured = r["frames"] + stats.get("program_captures", 0)
                    error = max(abs(a - b) for a, b in zip(r["losses"], r["eager"], strict=True))
                    lines.append(
                        f"| {model} | {route} | {start} | {seconds(r['process_s'])} "
                        f"| {seconds(sum(s))} | {seconds(s[0])} | {seconds(max(s[1:]))} "
                        f"| {ratio(r['process_s'], inductor) if inductor else '-'} "
                        f"| {captured} / {stats.get('aot_traces', 0)} / {stats['traces']} "
                        f"| {error:.1e} |")
    return (f"cold lengths {train_lengths(1)}; warm {train_lengths(2)}\n\n"
            + "\n".join(lines))
