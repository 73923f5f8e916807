"""A warm process loads only what a hit needs: tracing (torch._lazy, the
rewrites) and miss reports are imported by the first miss, so a process
that only reads never pays their memory (BENCHMARKS.md, memory)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import child_env

import ltc_cache
from zoo.corner_models import build, check_against_eager, random_inputs

pytestmark = pytest.mark.slow  # each test runs a child process

_WARM_CHILD = r"""
import json, sys
from zoo.corner_models import build, check_against_eager, random_inputs
import ltc_cache
gm, shapes = build(sys.argv[1])
compiled = ltc_cache.extract_compiled_graph(gm, random_inputs(shapes, seed=1))
check_against_eager(gm, compiled, shapes)
print(json.dumps({"stats": ltc_cache.stats(), "modules": sorted(sys.modules)}))
"""

# Loaded by a miss only.
_MISS_ONLY = {"torch._lazy", "ltc_cache.graph.extract", "ltc_cache.graph.rewrites",
              "ltc_cache.entries.miss_reasons", "filelock"}


def _child(case: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", _WARM_CHILD, case],
                          capture_output=True, text=True, env=child_env(), timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_warm_hit_imports_no_tracing_module(cache_dir):
    gm, shapes = build("inplace_update")
    check_against_eager(gm, ltc_cache.extract_compiled_graph(
        gm, random_inputs(shapes, seed=1)), shapes)
    report = _child("inplace_update")
    assert report["stats"]["hits"] == 1 and report["stats"]["traces"] == 0
    loaded = set(report["modules"])
    assert "ltc_cache.store.disk" in loaded  # it did read the disk
    assert not loaded & _MISS_ONLY


def test_a_miss_imports_what_it_needs(cache_dir):
    """The deferred imports are there when a process has to trace."""
    report = _child("weighted")
    assert report["stats"]["traces"] == 1 and report["stats"]["stores"] == 1
    assert {"ltc_cache.graph.extract", "ltc_cache.graph.rewrites",
            "ltc_cache.entries.miss_reasons"} <= set(report["modules"])
