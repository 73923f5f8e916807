"""Every counter of ``ltc_cache.stats()`` and ``ltc-cache stats``, declared
once: its name and what it counts. The modules that count import the names
from here; diagnostics.py says which of them a store's ledger keeps too.

``ltc_cache.stats()`` reports each as its name; ``ltc-cache stats`` labels
the ones it shows with ``label`` (where there is none, the name,
capitalised).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = [
    "AOT_GRAPHS",
    "AOT_TRACES",
    "ATEN_OPS",
    "COUNTERS",
    "DYNAMO_GRAPHS",
    "ERRORS",
    "EVICTIONS",
    "FUSED_CHECKS",
    "FUSED_COMPILES",
    "FUSED_LOADS",
    "FUSED_PICKUPS",
    "FUSED_PLAN_CHECKS",
    "FUSED_PLAN_LOADS",
    "FUSED_PLAN_QUEUED",
    "FUSED_PLAN_REFUSED",
    "FUSED_QUEUED",
    "FUSED_REFUSED",
    "HITS",
    "LTC_OPS",
    "MISSES",
    "NEGATIVE_HITS",
    "PLAN_HITS",
    "PLAN_MISSES",
    "PROGRAM_CAPTURES",
    "PROGRAM_FALLBACKS",
    "PROGRAM_HITS",
    "PROGRAM_LOOKUPS",
    "STORES",
    "TRACES",
    "CounterInfo",
]


@dataclass(frozen=True)
class CounterInfo:
    name: str
    description: str  # what it counts, in a line
    label: str | None = None  # ``ltc-cache stats``'s, where not the name capitalised


_counters: dict[str, CounterInfo] = {}


def _declare(name: str, description: str, label: str | None = None) -> str:
    assert name not in _counters, name
    _counters[name] = CounterInfo(name, description, label)
    return name


# The graph cache's lookups and what they led to (also in a store's ledger).
HITS = _declare("hits", "graph lookups that found a usable entry")
MISSES = _declare("misses", "graph lookups that found none")
TRACES = _declare("traces", "graphs traced through LTC (on a miss)")
STORES = _declare("stores", "entries written to the cache")
ERRORS = _declare("errors", "cache problems: unreadable entries, failed reads and writes, "
                            "libraries or graphs that failed")
NEGATIVE_HITS = _declare("negative_hits", "lookups that found a negative entry: the graph is "
                                          "not traced again")
# The directory's (``ltc-cache stats`` only).
EVICTIONS = _declare("evictions", "entries evicted for the size limit")
# The torch.compile backend's (also in a store's ledger).
AOT_TRACES = _declare("aot_traces", "AOTAutograd traces that ran", "AOT traces")
PLAN_HITS = _declare("plan_hits", "graphs built from a stored plan instead of an AOTAutograd "
                                  "trace", "Plan hits")
PLAN_MISSES = _declare("plan_misses", "plan lookups that found none, so AOTAutograd ran",
                       "Plan misses")
# The torch.compile backend's, per process.
ATEN_OPS = _declare("aten_ops", "aten ops in the graphs the backend compiled")
AOT_GRAPHS = _declare("aot_graphs", "graphs that went through AOTAutograd")
DYNAMO_GRAPHS = _declare("dynamo_graphs", "graphs Dynamo captured in this process and handed "
                                          "the backend (a loaded program's graph is not one; a "
                                          "plan, a negative entry and a region are three "
                                          "lookups of one)")
LTC_OPS = _declare("ltc_ops", "aten ops of the compiled graphs that run inside LTC")
# Whole programs (ltc_cache.compile), per process.
PROGRAM_HITS = _declare("program_hits", "programs loaded from the cache")
PROGRAM_CAPTURES = _declare("program_captures", "programs captured (and stored)")
PROGRAM_FALLBACKS = _declare("program_fallbacks", "calls routed to torch.compile")
PROGRAM_LOOKUPS = _declare("program_lookups", "program (or negative program) entries found")
# Fused libraries of graphs, per process.
FUSED_LOADS = _declare("fused_loads", "fused libraries loaded")
FUSED_REFUSED = _declare("fused_refused", "fused libraries refused")
FUSED_QUEUED = _declare("fused_queued", "graphs queued for the fusing worker")
FUSED_COMPILES = _declare("fused_compiles", "fused libraries (of graphs and plans) compiled, or "
                                            "refused at their compile, by this process")
FUSED_PICKUPS = _declare("fused_pickups", "libraries picked up from the worker while running")
FUSED_CHECKS = _declare("fused_checks", "comparisons of a library with TorchScript (a first "
                                        "call without a stored verdict, or a call where the "
                                        "library raised)")
# Fused libraries of plans, per process.
FUSED_PLAN_LOADS = _declare("fused_plan_loads", "fused plan libraries loaded")
FUSED_PLAN_REFUSED = _declare("fused_plan_refused", "fused plan libraries refused")
FUSED_PLAN_QUEUED = _declare("fused_plan_queued", "plans queued for the fusing worker")
FUSED_PLAN_CHECKS = _declare("fused_plan_checks", "comparisons of a plan's library with its "
                                                  "graphs")

# name -> what it is; every counter above, in the order declared.
COUNTERS: Mapping[str, CounterInfo] = MappingProxyType(_counters)
