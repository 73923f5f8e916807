"""Cold start, then warm start, of a model compiled with ltc_cache in two
fresh processes.

    python examples/demo.py [--blocks 128] [--dir DIR]

Each process builds the same 128-block MLP, compiles it with
``ltc_cache.compile`` (a drop-in for ``torch.compile(model,
backend="ltc_cache")``) and runs it once. The first process captures the
program with Dynamo, traces its graph with LTC and stores both; the second
loads them: no Dynamo capture, no trace. In a temporary directory (no
``--dir``) the fused tier is off: its background compile would outlive the
directory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def child(blocks: int) -> None:
    import torch
    from torch import nn

    import ltc_cache

    torch.manual_seed(0)
    layers = []
    for _ in range(blocks):
        layers += [nn.Linear(64, 64), nn.ReLU()]
    model = nn.Sequential(*layers).eval()
    x = torch.randn(8, 64)
    compiled = ltc_cache.compile(model)  # imports Dynamo: not timed, as in BENCHMARKS.md
    with torch.no_grad():
        start = time.perf_counter()
        out = compiled(x)
        first_result = time.perf_counter() - start
        error = (out - model(x)).abs().max().item()
    print(json.dumps({"seconds": first_result, "max_error": error, **ltc_cache.stats()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=128)
    parser.add_argument("--dir", help="cache directory (default: a new temporary one)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.blocks)
        return

    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, LTC_CACHE_DIR=args.dir or tmp)
        if not args.dir:
            # The fused libraries a first run queues are compiled in the
            # background, into the cache directory, after it exits: a
            # directory removed when the demo ends holds no such compile.
            env["LTC_CACHE_FUSE"] = "off"
        print(f"cache directory: {env['LTC_CACHE_DIR']}"
              + ("" if args.dir else " (temporary: fused tier off)"))
        runs = {}
        for label in ("cold", "warm"):
            proc = subprocess.run(
                [sys.executable, __file__, "--child", "--blocks", str(args.blocks)],
                env=env, capture_output=True, text=True, check=False,
            )
            if proc.returncode != 0:
                sys.exit(f"{label} run failed:\n{proc.stderr}")
            runs[label] = report = json.loads(proc.stdout.strip().splitlines()[-1])
            program = ("program loaded" if report.get("program_hits")
                       else "program captured")
            print(f"{label:5s} start: {report['seconds'] * 1000:8.1f} ms to first result "
                  f"({program}; traces={report['traces']} hits={report['hits']} "
                  f"stores={report['stores']}, max error vs eager {report['max_error']:.1e})")
        ratio = runs["warm"]["seconds"] / runs["cold"]["seconds"]
        print(f"warm / cold = {ratio:.2f}")


if __name__ == "__main__":
    main()
