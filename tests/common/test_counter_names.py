"""One registry of counters (ltc_cache/counter_names.py): each declared
once, with what it counts; the modules that count use its names."""
from __future__ import annotations

import ast
from pathlib import Path

from ltc_cache import counter_names
from ltc_cache.counter_names import COUNTERS
from ltc_cache.diagnostics import BACKEND_EVENTS, COUNTER_NAMES, LEDGER_EVENTS
from ltc_cache.report import STAT_LABELS, STAT_NAMES

PACKAGE = Path(__file__).resolve().parents[2] / "ltc_cache"


def test_every_counter_is_declared_once_with_what_it_counts():
    assert all(info.name == name and info.description.strip() for name, info in COUNTERS.items())
    declared = {getattr(counter_names, n) for n in counter_names.__all__
                if isinstance(getattr(counter_names, n), str)}
    assert declared == set(COUNTERS)
    assert set(COUNTER_NAMES) | set(BACKEND_EVENTS) | set(STAT_NAMES) | LEDGER_EVENTS \
        <= set(COUNTERS)


def test_ltc_cache_stats_shows_the_same_rows():
    assert STAT_NAMES == ("hits", "misses", "traces", "stores", "errors", "evictions",
                          "aot_traces", "plan_hits", "plan_misses")
    assert STAT_LABELS == {"aot_traces": "AOT traces", "plan_hits": "Plan hits",
                           "plan_misses": "Plan misses"}


def _spelled(tree: ast.AST) -> list[tuple[int, str]]:
    """Counter names written as strings: module-level constants, and the
    first argument of record, count_event, bump and add."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            found.append((node.lineno, node.value.value))
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)) \
                and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr) \
                in ("record", "count_event", "bump", "add") \
                and node.args and isinstance(node.args[0], ast.Constant):
            found.append((node.lineno, node.args[0].value))
    return [(line, text) for line, text in found if text in COUNTERS]


def test_no_module_spells_a_counter_name():
    spelled = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "counter_names.py":
            continue
        for line, text in _spelled(ast.parse(path.read_text())):
            spelled.append(f"{path.relative_to(PACKAGE)}:{line} {text!r}")
    assert not spelled, spelled
