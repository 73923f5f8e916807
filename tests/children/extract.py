"""A separate process for the core tests: extract each named case through
the cache configured by LTC_CACHE_* and check it against eager.

Prints one JSON object: this process's stats, how often it synced or made
lazy tensors (a hit must do neither), each case's key and any failure.
With --wait, it reads stdin to EOF before starting, so a test can release
several children at once.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch._lazy
import torch._lazy.metrics as metrics

import ltc_cache
from ltc_cache.graph.graph_keys import compute_key
from zoo.corner_models import build, check_against_eager, random_inputs

# Count syncs and lazy tensors made, across the metric resets a trace does.
syncs = 0
lazy_tensors_before_resets = 0
_sync_multi = torch._lazy.sync_multi
_reset = metrics.reset


def lazy_tensors_created() -> int:
    return int(metrics.counter_value("CreateLtcTensor") or 0)


def counting_sync_multi(*args, **kwargs):
    global syncs
    syncs += 1
    return _sync_multi(*args, **kwargs)


def counting_reset():
    global lazy_tensors_before_resets
    lazy_tensors_before_resets += lazy_tensors_created()
    _reset()


torch._lazy.sync_multi = counting_sync_multi
metrics.reset = counting_reset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", nargs="+")
    parser.add_argument("--seed", type=int, default=0, help="weight seed")
    parser.add_argument("--wait", action="store_true")
    args = parser.parse_args()
    if args.wait:
        sys.stdin.read()
    keys, failures = {}, {}
    for name in args.cases:
        gm, shapes = build(name, seed=args.seed)
        example = random_inputs(shapes, seed=1)
        keys[name] = compute_key(gm, example).digest
        try:
            compiled = ltc_cache.extract_compiled_graph(gm, example)
            check_against_eager(gm, compiled, shapes)
        except Exception as exc:
            failures[name] = f"{type(exc).__name__}: {exc}"
    print(json.dumps({
        "stats": ltc_cache.stats(),
        "syncs": syncs,
        "lazy_tensors_created": lazy_tensors_before_resets + lazy_tensors_created(),
        "keys": keys,
        "failures": failures,
    }))


if __name__ == "__main__":
    main()
