"""How long `ltc-cache ls` and `stats` take on a large cache, side by side.

    python -m tools.bench.cli                 # 10,000 entries
    python -m tools.bench.cli --entries 2000 --runs 9
    python -m tools.bench.cli --runs 9 --results   # into benchmarks/results/cli.json

Fills a fresh directory with real-shaped entries (one real extraction of an
MLP, re-encoded under distinct keys and names through DiskStore.put, so the
listing summaries are written the way the cache writes them), records hits
on a tenth of them, then measures in one run (medians of ``--runs``):

- the installed console script, end to end (interpreter start, imports,
  the command, with bytecode compiled as an installed package has it): wall
  seconds, and the CPU seconds of the child (user + system), which a machine
  shared with other jobs inflates far less;
- the same commands run in-process (the tool's own work, no start-up);
- the start-up alone: `import ltc_cache.cli` beside a bare `python -c pass`,
  and whether any of it imports torch (it must not);
- a listing that decodes every entry body instead of reading the ledger's
  summaries, beside the one ls uses;
- the hit-path cost of the persisted counters (DiskStore.record) beside
  the DiskStore.get that precedes it on a hit.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import hashlib
import io
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tools.results import Recorder, add_arguments


def median_seconds(runs: int, fn: Callable[[], object]) -> float:
    """Median wall seconds of ``runs`` calls."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def median_child(runs: int, argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Median wall and CPU (user + system) seconds of running ``argv``."""
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, env=env, check=True)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def console_script() -> str:
    script = Path(sys.executable).with_name("ltc-cache")
    if not script.exists():
        raise SystemExit(f"no ltc-cache next to {sys.executable}: pip install -e . first")
    return str(script)


def one_real_entry(workdir: Path) -> bytes:
    """The stored bytes of one real extraction (an 8-block MLP)."""
    import torch
    from torch import fx, nn

    from ltc_cache import CacheConfig, GraphCache

    torch.manual_seed(0)
    model = nn.Sequential(*(layer for _ in range(8) for layer in (nn.Linear(32, 32), nn.ReLU())))
    cache = GraphCache(CacheConfig(directory=workdir / "source"))
    cache.extract_compiled_graph(fx.symbolic_trace(model), [torch.randn(4, 32)], name="mlp")
    store = cache.store
    (key,) = [row.key for row in store.rows() if len(row.key) == 64]
    return store.get(key)


def fill(directory: Path, template: bytes, count: int) -> float:
    """``count`` entries like ``template`` under distinct keys; returns seconds."""
    from ltc_cache.entries.entry import decode, encode
    from ltc_cache.store import DiskStore

    entry = decode(template)
    store = DiskStore(directory)
    now = time.time()
    start = time.perf_counter()
    for i in range(count):
        key = hashlib.sha256(f"bench-{i}".encode()).hexdigest()
        meta = {**entry.meta, "graph_name": f"model{i % 97}_graph{i % 7}",
                "created": now - 86400 * (i % 60)}
        store.put(key, encode(dataclasses.replace(entry, key=key, meta=meta)))
        if i % 10 == 0:
            store.record("hits", key)
    seconds = time.perf_counter() - start
    store.close()
    return seconds


def in_process(argv: list[str]) -> None:
    from ltc_cache.cli import main

    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0


def decode_everything(directory: Path) -> int:
    """The listing without summaries: read and decode every entry body."""
    from ltc_cache.entries.entry import decode
    from ltc_cache.store import ReadOnlyDiskStore

    store = ReadOnlyDiskStore(directory)
    count = 0
    for row in store.rows():
        entry = decode(store.peek(row.key), expected_key=row.key)
        count += len(entry.meta["graph_name"]) > 0
    store.close()
    return count


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.cli",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5, help="runs per measurement (median)")
    add_arguments(parser, "cli")
    args = parser.parse_args()
    recorder = Recorder.from_args("tools.bench.cli", args)

    from ltc_cache.report import scan
    from ltc_cache.store import DiskStore, ReadOnlyDiskStore

    script = console_script()
    workdir = Path(tempfile.mkdtemp(prefix="ltc-bench-cli-"))
    try:
        directory = workdir / "cache"
        template = one_real_entry(workdir)
        fill_s = fill(directory, template, args.entries)
        store = DiskStore(directory)
        entries = len(scan(store).entries)
        print(f"{entries} entries of {len(template)} bytes in {directory} "
              f"(filled in {fill_s:.1f} s, {1e3 * fill_s / entries:.2f} ms a put)")
        print(f"median of {args.runs} runs, seconds; load average {os.getloadavg()[0]:.1f} "
              f"on {os.cpu_count()} CPUs at the start\n")

        # This process holds torch (the fill needed it); the console script
        # does not. Keep torch's objects out of the collector's full passes,
        # so the in-process column is the command's own work.
        gc.freeze()
        as_is = {k: v for k, v in os.environ.items() if not k.startswith("LTC_CACHE_")}
        # As an installed package runs: with its bytecode compiled (kept in
        # the work directory, so the source tree gets no __pycache__).
        env = {k: v for k, v in as_is.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(workdir / "pycache")
        subprocess.run([sys.executable, "-c", "import ltc_cache.cli"], env=env, check=True)
        rows = []
        for label, argv in (("ls", ["ls"]), ("ls --json", ["ls", "--json"]),
                            ("stats", ["stats"]), ("stats --json", ["stats", "--json"])):
            full = ["--dir", str(directory), *argv]
            wall, cpu = median_child(args.runs, [script, *full], env)
            own = median_seconds(args.runs, lambda full=full: in_process(full))
            rows.append((label, wall, cpu, own))
        python = median_child(args.runs, [sys.executable, "-c", "pass"], env)
        startup = median_child(args.runs, [sys.executable, "-c", "import ltc_cache.cli"], env)

        print(f"{'command':<14}{'end to end':>12}{'(CPU)':>8}{'in-process':>12}")
        for label, wall, cpu, own in rows:
            print(f"{label:<14}{wall:>12.3f}{cpu:>8.3f}{own:>12.3f}")
        print(f"\nstart-up, wall (CPU): python -c pass {python[0]:.3f} ({python[1]:.3f}); "
              f"import ltc_cache.cli {startup[0]:.3f} ({startup[1]:.3f})")
        if as_is.get("PYTHONDONTWRITEBYTECODE"):
            wall, cpu = median_child(args.runs, [script, "--dir", str(directory), "ls"], as_is)
            print(f"ls with PYTHONDONTWRITEBYTECODE=1 as set here (ltc_cache compiled at "
                  f"every start): {wall:.3f} ({cpu:.3f})")
        importers = sorted(_torch_importers(script, directory, env))
        print(f"torch imported by ls / stats: {importers} (must be empty)")

        naive = median_seconds(args.runs, lambda: decode_everything(directory))
        listing = median_seconds(args.runs, lambda: scan(ReadOnlyDiskStore(directory)))
        print(f"\nscan from ledger summaries {listing:.3f} s; decoding every body "
              f"{naive:.3f} s ({naive / listing:.1f}x)")

        keys = [row.key for row in store.rows()[:1000]]
        get_s = median_seconds(args.runs, lambda: [store.get(k) for k in keys]) / len(keys)
        record_s = median_seconds(
            args.runs, lambda: [store.record("hits", k) for k in keys]) / len(keys)
        print(f"\nhit path, per call: DiskStore.get {1e6 * get_s:.0f} us, "
              f"DiskStore.record {1e6 * record_s:.0f} us ({record_s / get_s:.2f}x a get)")
        print(f"load average {os.getloadavg()[0]:.1f} at the end")
        store.close()
        if recorder:
            method = (f"{entries:,} entries ({len(template) / 1e3:.1f} KB each, a tenth of "
                      f"them hit), medians of {args.runs} runs, seconds: the installed console "
                      "script end to end (and its CPU seconds), and the command in-process.")
            recorder.write("cli", [results_table(rows, python, startup, importers)],
                           threads="no torch", describe={"method": method})
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def results_table(rows: list[tuple[str, float, float, float]], python: tuple[float, float],
                  startup: tuple[float, float], importers: list[str]) -> dict:
    """cli.json's ``commands`` table: a row a command, and the start-up in a note."""
    who = "Neither command imports torch" if not importers else (
        f"torch is imported by {', '.join(importers)}")
    note = (f"{who}; `import ltc_cache.cli` takes {startup[0]:.2f} s ({startup[1]:.2f} s CPU) "
            f"beside {python[0]:.2f} s for `python -c pass`.")
    return {"id": "commands", "notes": [note], "rows": [
        {"command": f"`{label}`", "end_to_end_s": round(wall, 2), "cpu_s": round(cpu, 2),
         "in_process_s": round(own, 2)} for label, wall, cpu, own in rows]}


def _torch_importers(script: str, directory: Path, env: dict[str, str]) -> set[str]:
    """The commands among ls and stats whose `-X importtime` log names torch."""
    found = set()
    for argv in (["ls"], ["ls", "--json"], ["stats"], ["stats", "--json"]):
        log = subprocess.run([sys.executable, "-X", "importtime", script, "--dir",
                              str(directory), *argv], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, env=env, check=True).stderr
        if any(line.rsplit("|", 1)[-1].strip() == "torch" for line in log.splitlines()):
            found.add(" ".join(argv))
    return found


if __name__ == "__main__":
    main()
