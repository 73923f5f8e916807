"""Start-up of a serving fleet (examples/serve.py), cold against warm, side by side.

    python -m tools.bench.serve                  # 1, 4 and 8 workers, GPT-2
    python -m tools.bench.serve --workers 1 4 --model mlp
    python -m tools.bench.serve --model gpt2 --results   # into benchmarks/results/fleet.json

For each fleet size, in one run: a cold start on an empty cache directory,
a warm start on the directory the cold one filled and, where redis-server
is installed, a warm start of a "second machine": an empty directory over
the Redis tier the first machine filled (LTC_CACHE_REMOTE). It prints each
worker's start-up (process start to first result) and compile time (first
call to first result), the slowest worker of the fleet, and warm/cold.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from tools.harness import ROOT
from tools.results import Recorder, add_arguments

SERVE = ROOT / "examples" / "serve.py"


def serve(workers: int, model: str, env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, str(SERVE), "--workers", str(workers), "--model",
                           model, "--requests", str(4 * workers), "--json"],
                          capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"serve.py failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def redis_server(directory: Path) -> Iterator[str | None]:
    """A private redis-server for the run, or None where there is none."""
    if shutil.which("redis-server") is None:
        yield None
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--dir", str(directory), "--save", "", "--appendonly", "no"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if "Ready to accept connections" in line:
                break
        else:
            raise SystemExit("redis-server did not start")
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait()


def summary(report: dict) -> dict:
    startup = [w["startup_s"] for w in report["workers"]]
    compile_s = [w["compile_s"] for w in report["workers"]]
    return {"ready": max(startup), "compile_med": statistics.median(compile_s),
            "compile_max": max(compile_s), "traces": report["traces"],
            "graphs": report["graphs"],
            "remote_hits": sum(w["remote_hits"] for w in report["workers"])}


def results_rows(model: str, rows: list[tuple[int, str, dict, float]]) -> list[dict]:
    """fleet.json's rows of a model (its table), a fleet size and start a row."""
    return [{"model": model, "workers": n, "start": kind, "ready_s": round(s["ready"], 2),
             "compile_median_s": round(s["compile_med"], 2),
             "compile_slowest_s": round(s["compile_max"], 2), "traces": s["traces"],
             "redis_hits": s["remote_hits"], "compile_vs_cold": round(ratio, 2)}
            for n, kind, s, ratio in rows]


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.serve",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--model", default="gpt2")
    add_arguments(parser, "fleet")
    args = parser.parse_args()
    recorder = Recorder.from_args("tools.bench.serve", args)
    base = {k: v for k, v in os.environ.items() if not k.startswith("LTC_CACHE_")}
    base["LTC_CACHE_FUSE"] = "off"  # start-up of the replay tier, no background compiles
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.workers:
            root = Path(tmp) / f"fleet{n}"
            (root / "redis").mkdir(parents=True)
            with redis_server(root / "redis") as url:
                first = dict(base, LTC_CACHE_DIR=str(root / "machine_a"))
                if url:
                    first["LTC_CACHE_REMOTE"] = url
                runs = {"cold": serve(n, args.model, first),
                        "warm": serve(n, args.model, first)}
                if url:
                    second = dict(first, LTC_CACHE_DIR=str(root / "machine_b"))
                    runs["warm from redis"] = serve(n, args.model, second)
            cold = summary(runs["cold"])
            for kind, report in runs.items():
                s = summary(report)
                rows.append((n, kind, s, s["compile_max"] / cold["compile_max"]))
            print(f"{n} worker(s) done", file=sys.stderr)

    print(f"model {args.model}, {os.cpu_count()} cores; seconds; compile = first call to "
          "first result, ready = process start to first result (slowest worker)")
    print(f"{'workers':>7}  {'start':<16} {'ready':>6} {'compile med':>11} "
          f"{'compile max':>11} {'traces':>6} {'remote hits':>11} {'compile/cold':>12}")
    for n, kind, s, ratio in rows:
        print(f"{n:>7}  {kind:<16} {s['ready']:>6.2f} {s['compile_med']:>11.2f} "
              f"{s['compile_max']:>11.2f} {s['traces']:>6} {s['remote_hits']:>11} "
              f"{ratio:>12.2f}")
    if recorder:
        # The table of the model; a run of some fleet sizes refreshes their rows.
        recorder.write("fleet", [{"id": args.model, "rows": results_rows(args.model, rows)}],
                       threads="the cores shared out among the workers",
                       merge_on={args.model: ("workers", "start")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
