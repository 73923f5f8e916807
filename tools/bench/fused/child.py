"""What ``python -m tools.bench.fused --child SPEC`` runs in a fresh process:
the cold preparing run, the fusing run, the measuring run and a warm first
call, each reporting one JSON object (with the cache directory's
inventory of regions and fused libraries) to the driver."""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Iterator
from typing import Any

from tools.bench.fused.variants import (
    FUSE_MODES,
    LABELS,
    Row,
    build,
    counts,
    difference,
    fuse_mode,
    grad_mode,
    make_unit,
    set_up,
    time_rounds,
)


def stored(kind: str) -> Iterator[Any]:
    """The entries of ``kind`` in the environment's cache directory."""
    import ltc_cache
    from ltc_cache.entries.keys import CacheKey
    from ltc_cache.entries.wire import is_entry_key

    cache = ltc_cache.default_cache()
    store = cache.store
    for key in list(store.keys()) if store is not None else []:
        if not is_entry_key(key):
            continue  # an internal record: lookup_entry would drop it as corrupt
        entry = cache.lookup_entry(CacheKey(key, {}), count=False)
        if entry is not None and entry.kind == kind:
            yield entry


def inventory() -> dict[str, Any]:
    """The cache directory's regions (graph entries) and their fused
    entries: libraries, refusals with their reasons, the compiles' seconds;
    and the plans' graphs (whole-plan libraries: ``plan`` in their items)."""
    from ltc_cache.compile_backend.plan_library import plan_parts

    libraries, refusals = [], []
    plans = {entry.key: len(plan_parts(entry)) for entry in stored("plan")}
    for entry in stored("fused"):
        p = entry.payload
        item = {"graph": entry.graph_name, "graph_key": str(p.get("graph_key", ""))[:12],
                "compile_seconds": float(p.get("compile_seconds") or 0.0),
                "script_ms": p.get("script_ms"), "fused_ms": p.get("fused_ms"),
                "plan": p.get("graph_key") in plans}
        if "library" in p:
            libraries.append(item)
        else:
            refusals.append({**item, "reason": str(p.get("reason", ""))})
    return {"regions": sum(1 for _ in stored("graph")), "plan_graphs": sum(plans.values()),
            "libraries": libraries,
            "refusals": refusals,
            "fuse_seconds": sum(i["compile_seconds"] for i in libraries + refusals)}


def ltc_warnings(caught: list[Any]) -> list[str]:
    seen: list[str] = []
    for w in caught:
        text = str(w.message)
        if any(word in text for word in ("ltc_cache", "fused", "TorchScript", "LTC")) \
                and text not in seen:
            seen.append(text[:600])
    return seen


def child_measure(row: Row, options: dict[str, Any]) -> dict[str, Any]:
    import warnings

    base, args, kwargs = build(row)
    variants, failures = {}, {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for label in LABELS:
            try:
                variants[label] = set_up(row, label, base, args, kwargs, options["new"])
            except Exception:
                failures[label] = traceback.format_exc()
        if "eager" not in variants:
            return {"failures": failures}
        calls = {label: 1 if row.mode == "decode"
                 else max(1, math.ceil(options["round_ms"] / max(v["estimate_ms"], 1e-3)))
                 for label, v in variants.items()}
        times = time_rounds(row, {k: v["unit"] for k, v in variants.items()}, calls,
                            options["rounds"])
    want = variants["eager"]["result"]
    return {
        "times": times, "calls": calls, "failures": failures,
        "errors": {k: difference(v["result"], want) for k, v in variants.items()},
        "set_up_seconds": {k: v["seconds"] for k, v in variants.items()},
        "counts": {k: v["counts"] for k, v in variants.items()},
        "warnings": ltc_warnings(caught), "inventory": inventory(),
    }


def child_cold(row: Row, options: dict[str, Any]) -> dict[str, Any]:
    """The cold process: the fused variant's calls under LTC_CACHE_FUSE=
    ``--prepare`` (``sync``: each region compiled before its first call;
    ``off``: the graphs stored, compiled by :func:`child_fuse` next)."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("ltc_cache.fused").setLevel(logging.INFO)
    base, args, kwargs = build(row)
    fused = set_up(row, "fused", base, args, kwargs, options["new"], fuse=options["prepare"])
    return {"counts": fused["counts"], "inventory": inventory()}


def child_fuse(row: Row, options: dict[str, Any]) -> dict[str, Any]:
    """Every stored region without a fused entry compiled into one, in a
    process of its own, as the background worker (and ``ltc-cache fuse``)
    does: :func:`ltc_cache.graph.fused.tier.fuse_graph`."""
    import logging

    import ltc_cache
    from ltc_cache.compile_backend.plan_library import fuse_stored
    from ltc_cache.graph.fused.tier import fuse_graph

    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("ltc_cache.fused").setLevel(logging.INFO)
    cache = ltc_cache.default_cache()
    for graph in list(stored("graph")):
        fuse_graph(cache, graph.key, graph=graph, timeout=cache.config.fuse_timeout)
    # Then the plans' whole-graph libraries, timed against their regions' libraries.
    for plan in list(stored("plan")):
        fuse_stored(cache, plan.key, timeout=cache.config.fuse_timeout)
    return {"inventory": inventory()}


def child_first(row: Row, label: str, started: float, options: dict[str, Any]) -> dict[str, Any]:
    """A warm process's first call (step, request) of ``label``'s variant."""
    base, args, kwargs = build(row)
    with fuse_mode(FUSE_MODES.get(label)), grad_mode(row):
        unit = make_unit(row, label, base, args, kwargs, options["new"])
        call = time.perf_counter()
        unit.run()
        done = time.time()
    return {"from_start_s": done - started, "first_call_s": time.perf_counter() - call,
            "counts": counts()}


def child(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    if spec["threads"] == "1":
        torch.set_num_threads(1)
    row = Row.parse(spec["row"])
    if spec["task"] == "cold":
        return child_cold(row, spec)
    if spec["task"] == "fuse":
        return child_fuse(row, spec)
    if spec["task"] == "measure":
        return child_measure(row, spec)
    return child_first(row, spec["label"], spec["started"], spec)
