"""Eight processes share one cache directory, released at once, each running
a few hundred random gets, puts and extracts on keys the others use too."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from collections import Counter

import pytest
from helpers import RELIABILITY_CHILD, decode_all

from ltc_cache.store import DiskStore
from zoo.reliability_models import MODELS

# End to end: eight processes at once (`pytest -m "not slow"` skips it).
pytestmark = pytest.mark.slow

PROCESSES = 8
OPS = 300


def test_eight_processes_mixed_operations(tmp_path):
    directory = tmp_path / "cache"
    children = [
        subprocess.Popen([sys.executable, str(RELIABILITY_CHILD), "mixed", str(directory),
                          str(seed), str(OPS)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
        for seed in range(PROCESSES)
    ]
    # Each child imports torch and builds its models, then waits for its
    # line; all are released together.
    for child in children:
        child.stdin.write("go\n")
        child.stdin.flush()
    reports = []
    for child in children:
        out, err = child.communicate(timeout=600)
        assert child.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))

    for report in reports:
        assert report["problems"] == []
        assert report["warnings"] == []
        assert report["stats"]["errors"] == 0
        assert sum(report["done"].values()) == OPS
        # No process traces a key twice.
        assert max(report["traces"].values()) <= 1
    # And across processes each key was traced once: the others waited on
    # its lock and loaded what the first one stored.
    graphs = [name for name in MODELS if name != "deep"]
    assert {name: sum(r["traces"][name] for r in reports) for name in graphs} \
        == dict.fromkeys(graphs, 1)

    done = Counter()
    for report in reports:
        done.update(report["done"])
    print(f"{PROCESSES} processes x {OPS} operations: {dict(done)}")

    store = DiskStore(directory)
    count, problems = decode_all(store)
    assert problems == [] and count >= len(graphs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert store.cache.check() == []
    assert [str(w.message) for w in caught] == []
