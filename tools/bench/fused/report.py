"""The tables of ``python -m tools.bench.fused`` (steady state; preparation
and warm first calls; the notes under them) and its ``--results`` rows
(steady_state.json, suite_fused.json)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from tools.bench.fused.variants import LABELS, TITLES, Row
from tools.harness import ratio, table
from tools.results import Recorder, two_figures


def per_unit(row: str, ms: float | None) -> str:
    if ms is None:
        return "-"
    if row.endswith("/decode"):
        return f"{ms:.2f} ms/token ({1e3 / ms:.0f} tok/s)"
    return f"{ms:.2f} ms"


def libraries_cell(result: dict[str, Any]) -> str:
    measured = result.get("measure", {})
    inv = measured.get("inventory") or result["prepare"].get("inventory") or {}
    fused = measured.get("counts", {}).get("fused", {})
    loads, plan_loads = fused.get("fused_loads"), fused.get("fused_plan_loads", 0)
    libraries = inv.get("libraries", [])
    regions = sum(1 for i in libraries if not i.get("plan"))
    cell = f"{regions} of {inv.get('regions', '?')}"
    if inv.get("plan_graphs"):
        whole = len(libraries) - regions
        cell += f"; whole plans {whole} of {inv['plan_graphs']}, {plan_loads} loaded"
    if loads == 0 and not plan_loads:
        return cell + ", **none loaded**"
    return cell + (f", {loads} loaded" if loads is not None else "")


def clock_of(threads: str, clock: str) -> str:
    return clock if clock != "auto" else "cpu" if threads == "1" else "wall"


def steady_row(result: dict[str, Any], clock: str) -> list[str]:
    name, measured = result["row"], result.get("measure", {})
    if "times" not in measured:
        why = "prepare failed" if "crash" in result["prepare"] else "measure failed"
        return [name, why, *["-"] * (len(STEADY_HEADER) - 2)]
    ms = {k: v[f"{clock}_ms"] for k, v in measured["times"].items()}
    fused = ms.get("fused")
    errors = measured["errors"]
    return [name, *(per_unit(name, ms.get(label)) for label in LABELS),
            f"**{ratio(fused, ms.get('inductor'))}**", ratio(fused, ms.get("ts")),
            ratio(fused, ms.get("eager")), libraries_cell(result),
            ", ".join(f"{errors[k]:.1e}" if k in errors else "-"
                      for k in ("fused", "ts", "inductor"))]


STEADY_HEADER = ["row", "eager", "TorchScript tier", "fused", "Inductor", "fused / Inductor",
                 "fused / TorchScript", "fused / eager", "libraries of regions",
                 "max error (fused, TorchScript, Inductor)"]


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def first_cell(result: dict[str, Any], label: str) -> str:
    first = result.get("first", {}).get(label)
    if first is None:
        return "-"
    if "crash" in first:
        return "crash"
    return f"{first['from_start_s']:.2f} s ({first['first_call_s']:.2f})"


def preparation_row(result: dict[str, Any]) -> list[str]:
    prepared = result["prepare"]
    inv = result.get("measure", {}).get("inventory") or prepared.get("inventory") or {}
    before = prepared.get("inventory") or {}
    late = (len(inv.get("libraries", [])) + len(inv.get("refusals", []))
            - len(before.get("libraries", [])) - len(before.get("refusals", [])))
    earlier = " (earlier run)" if prepared.get("reused") else ""
    return [result["row"], str(inv.get("regions", "-")), str(len(inv.get("libraries", []))),
            str(len(inv.get("refusals", []))) + (f" (+{late} while measuring)" if late else ""),
            seconds(inv.get("fuse_seconds")),
            f"{seconds(prepared.get('cold_seconds'))} ({prepared.get('mode', '-')}){earlier}",
            seconds(prepared.get("fuse_seconds")) + earlier,
            seconds(result.get("measure_seconds")),
            *(first_cell(result, label) for label in ("fused", "ts", "inductor"))]


PREPARATION_HEADER = ["row", "regions", "libraries", "refused", "fuse (compile_seconds)",
                      "cold process (LTC_CACHE_FUSE)", "fusing process", "measuring process",
                      "warm first call, fused: s from process start (call alone)",
                      "TorchScript tier", "Inductor"]


def notes(results: list[dict[str, Any]]) -> list[str]:
    """Refusals, warnings, missing libraries and failures, quoted."""
    lines = []
    for r in results:
        name, measured = r["row"], r.get("measure", {})
        for where, what in (("prepare", r["prepare"]), ("measure", measured),
                            *((f"first call ({k})", v) for k, v in r.get("first", {}).items())):
            if "crash" in what:
                lines.append(f"- {name}: {where} crashed:\n\n```\n{what['crash']}\n```")
        for label, trace in measured.get("failures", {}).items():
            lines.append(f"- {name}: {TITLES[label]} failed:\n\n```\n{trace.strip()}\n```")
        fused = measured.get("counts", {}).get("fused", {})
        if fused and not fused.get("fused_loads") and not fused.get("fused_plan_loads"):
            lines.append(f"- {name}: the fused variant loaded **no library** (fused_loads and "
                         "fused_plan_loads 0)")
        if fused.get("fused_queued"):
            lines.append(f"- {name}: the fused variant queued {fused['fused_queued']} graph(s) "
                         "for the background worker: not all were prepared")
        for refusal in (measured.get("inventory") or {}).get("refusals", []):
            lines.append(f"- {name}: refused {refusal['graph']} ({refusal['graph_key']}, "
                         f"{refusal['compile_seconds']:.1f} s): {refusal['reason']}")
        if fused.get("fused_plan_refused"):
            lines.append(f"- {name}: {fused['fused_plan_refused']} plan library(ies) refused "
                         "on first use")
        if fused.get("fused_refused"):
            lines.append(f"- {name}: {fused['fused_refused']} library(ies) refused on first use")
        lines += [f"- {name}: warning: {w}" for w in measured.get("warnings", [])]
    return lines


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    out = []
    for threads in dict.fromkeys(r["threads"] for r in results):
        mine = [r for r in results if r["threads"] == threads]
        clock = clock_of(threads, args.clock)
        out.append(f"### Fused tier, steady state, {threads} thread(s), {clock} time, "
                   f"median of {args.rounds} rounds (load average {os.getloadavg()[0]:.1f})\n")
        out.append(table([STEADY_HEADER, *(steady_row(r, clock) for r in mine)]))
        out.append(f"\n### Preparation and warm first calls, {threads} thread(s)\n")
        out.append(table([PREPARATION_HEADER, *(preparation_row(r) for r in mine)]))
        lines = notes(mine)
        if lines:
            out.append("\n" + "\n".join(lines))
        out.append("")
    return "\n".join(out)


def _share(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 2)


def results_cells(result: dict[str, Any], clock: str) -> dict[str, Any]:
    """A row's cells as steady_state.json and suite_fused.json hold them
    (milliseconds under the names of its labels)."""
    measured = result.get("measure", {})
    if "times" not in measured:
        why = "prepare failed" if "crash" in result["prepare"] else "measure failed"
        return {**dict.fromkeys(("eager", "torchscript", "fused", "inductor",
                                 "fused_vs_inductor", "fused_vs_torchscript", "fused_vs_eager",
                                 "error_fused", "error_torchscript", "error_inductor")),
                "libraries": why}
    ms = {k: v[f"{clock}_ms"] for k, v in measured["times"].items()}
    errors, fused = measured["errors"], ms.get("fused")
    return {"eager": _round(ms.get("eager")), "torchscript": _round(ms.get("ts")),
            "fused": _round(fused), "inductor": _round(ms.get("inductor")),
            "fused_vs_inductor": _share(fused, ms.get("inductor")),
            "fused_vs_torchscript": _share(fused, ms.get("ts")),
            "fused_vs_eager": _share(fused, ms.get("eager")),
            "libraries": libraries_cell(result),
            **{f"error_{name}": two_figures(errors.get(label)) for label, name in
               (("fused", "fused"), ("ts", "torchscript"), ("inductor", "inductor"))}}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


# The columns of a steady-state table, either thread count.
STEADY_COLUMNS = [
    {"key": "row", "label": "row"}, {"key": "unit", "label": "unit"},
    *({"key": key, "label": label, "format": ".2f"} for key, label in (
        ("eager", "eager"), ("torchscript", "TorchScript tier"), ("fused", "fused tier"),
        ("inductor", "Inductor"))),
    {"key": "fused_vs_inductor", "label": "fused / Inductor", "format": ".2f", "bold": True},
    {"key": "fused_vs_torchscript", "label": "fused / TorchScript", "format": ".2f"},
    {"key": "fused_vs_eager", "label": "fused / eager", "format": ".2f"},
    {"key": "libraries", "label": "libraries of regions"},
    *({"key": f"error_{key}", "label": label, "format": ".1e"} for key, label in (
        ("fused", "max error: fused"), ("torchscript", "TorchScript"),
        ("inductor", "Inductor"))),
]
DEFAULT_THREADS = {
    "title": "Steady state at torch's default thread count",
    "question": "Is the fused tier as fast as Inductor where torch uses every core, as a "
                "user's process does?",
    "method": "Wall time per call, training step or token, medians of 15 interleaved rounds in "
              "one warm process holding every variant, at torch's default thread count; the "
              "rows as in the one-thread table.",
}


def write_results(recorder: Recorder, results: list[dict[str, Any]], clock: str,
                  default_clock: str) -> None:
    """The one-thread rows into their files: suite rows into suite_fused.json's
    ``models``, the others into steady_state.json's ``one_thread``; the
    default-thread steady rows into steady_threads.json's ``default``."""
    suite, steady, threaded = [], [], []
    for result in results:
        row = Row.parse(result["row"])
        unit = "ms/token" if row.mode == "decode" else "ms"
        if result["threads"] != "1":
            if row.group != "suite":
                threaded.append({"row": row.name, "unit": unit,
                                 **results_cells(result, default_clock)})
            continue
        cells = results_cells(result, clock)
        if row.group == "suite":
            first = {label: (result.get("first") or {}).get(label) or {}
                     for label in ("fused", "ts", "inductor")}
            suite.append({"model": row.model, "mode": row.mode,
                          **{f"{k}_ms" if k in ("eager", "torchscript", "fused", "inductor")
                             else k: v for k, v in cells.items()},
                          **{f"first_call_{name}_s": _round(first[label].get("first_call_s"))
                             for label, name in (("fused", "fused"), ("ts", "torchscript"),
                                                 ("inductor", "inductor"))}})
        else:
            steady.append({"row": row.name, "unit": unit, **cells})
    if suite:
        recorder.write("suite_fused", [{"id": "models", "rows": suite}], threads=1,
                       merge_on={"models": ("model", "mode")})
    if steady:
        recorder.write("steady_state", [{"id": "one_thread", "rows": steady}], threads=1,
                       merge_on={"one_thread": ("row",)})
    if threaded:
        recorder.write("steady_threads", [{"id": "default", "columns": STEADY_COLUMNS,
                                           "rows": threaded}],
                       threads="default", merge_on={"default": ("row",)},
                       describe=DEFAULT_THREADS)
