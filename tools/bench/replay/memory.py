"""``python -m tools.bench.replay --sections memory``: the peak RSS of a warm
process against an eager one, each a fresh subprocess."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.harness import table, with_import_roots

_MEMORY_CHILD = r"""
import json, sys, time
mode, width = sys.argv[1], int(sys.argv[2])
import torch
from torch import fx
torch.set_num_threads(1)
from zoo.fx_models import build
model, example = build("mlp128", width)
gm = fx.symbolic_trace(model)
def status():
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent
    # across fork and exec, so a child of a big process would report its size.
    # RssAnon is the process's own memory; RssFile the pages of mapped files
    # (libraries) it touched, shared with other processes mapping them.
    fields = {}
    for line in open("/proc/self/status"):
        name, _, value = line.partition(":")
        if name in ("VmHWM", "RssAnon", "RssFile"):
            fields[name] = int(value.split()[0]) * 1024
    return fields
def peak():
    return status()["VmHWM"]
before = imported = extracted = peak()
stats = {}
with torch.no_grad():
    if mode == "eager":
        run = model
    else:
        import ltc_cache, ltc_cache.graph.cache, ltc_cache.store
        imported = peak()
        run = ltc_cache.extract_compiled_graph(gm, example)
        extracted = peak()
    run(*example)
    first = peak()
    for _ in range(19):
        run(*example)
    if mode != "eager":
        stats = ltc_cache.stats()
end = status()
print(json.dumps({"before": before, "imported": imported, "extracted": extracted,
                  "first": first, "peak": end["VmHWM"], "anon": end["RssAnon"],
                  "file": end["RssFile"], "stats": stats}))
"""


def memory(width: int, repeats: int) -> str:
    from ltc_cache.store import DiskStore

    rows = [["process", "peak RSS (median)", "after building the model", "growth",
             "of which: import ltc_cache", "the hit", "first call", "19 more calls",
             "at the end: anonymous", "mapped files"]]
    with tempfile.TemporaryDirectory(prefix="ltc-bench-mem-") as tmp:
        env = with_import_roots(dict(os.environ, LTC_CACHE_DIR=tmp))
        filled = _memory_child("warm", width, env)  # fills the cache
        assert filled["stats"]["stores"] == 1, filled
        store = DiskStore(Path(tmp))
        stored = sum(len(store.get(k) or b"") for k in store.keys())  # noqa: SIM118
        store.close()
        results: dict[str, list[dict]] = {"eager": [], "warm": []}
        for _ in range(repeats):
            for mode in results:
                results[mode].append(_memory_child(mode, width, env))
    # A warm process that traced would measure something else.
    assert all(r["stats"]["hits"] == 1 and r["stats"]["traces"] == 0
               for r in results["warm"]), results["warm"]
    fields = ("before", "imported", "extracted", "first", "peak", "anon", "file")
    med = {m: {k: statistics.median(r[k] for r in rs) for k in fields}
           for m, rs in results.items()}
    for mode in ("eager", "warm"):
        m = med[mode]
        rows.append([f"{mode} (mlp128, 20 calls)", _mb(m["peak"]), _mb(m["before"]),
                     _mb(m["peak"] - m["before"]), _mb(m["imported"] - m["before"]),
                     _mb(m["extracted"] - m["imported"]), _mb(m["first"] - m["extracted"]),
                     _mb(m["peak"] - m["first"]), _mb(m["anon"]), _mb(m["file"])])
    budget = med["eager"]["peak"] + stored
    return ("### Peak RSS of a warm process against eager\n\n" + table(rows) +
            f"\n\nstored entries: {stored / 1024:,.0f} KiB; warm peak - (eager peak + stored) = "
            f"{_mb(med['warm']['peak'] - budget)} (anonymous "
            f"{_mb(med['warm']['anon'] - med['eager']['anon'])}, mapped files "
            f"{_mb(med['warm']['file'] - med['eager']['file'])} over eager's at the end)")


def _memory_child(mode: str, width: int, env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-c", _MEMORY_CHILD, mode, str(width)],
                          capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"memory child failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _mb(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"
