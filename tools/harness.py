"""What the benchmark tools share: the environment of a measured child
process, running one and reading the JSON line it prints last, cold then
warm runs over the same caches, medians, ratios, seconds, and the Markdown
table BENCHMARKS.md takes.

A measured child is a fresh Python process, so that nothing the parent
imported or compiled counts for it; "cold" runs over empty cache
directories, "warm" is the next process over the same ones.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
CHILDREN = TESTS / "children"


def import_path(pythonpath: str | None) -> str:
    """``pythonpath`` with the repository root and ``tests/`` first, as
    pytest's ``pythonpath`` has them: a child started by path (a test's
    child script, ``-c`` code) imports ``zoo``, ``tools`` and the tests'
    ``helpers`` as the tests do."""
    roots = [str(ROOT), str(TESTS)]
    kept = [p for p in (pythonpath or "").split(os.pathsep) if p and p not in roots]
    return os.pathsep.join(roots + kept)


def with_import_roots(env: dict[str, str]) -> dict[str, str]:
    """``env`` with :func:`import_path` as its PYTHONPATH."""
    env["PYTHONPATH"] = import_path(env.get("PYTHONPATH"))
    return env


def child_env(directory: Path) -> dict[str, str]:
    """The environment of a measured process: its caches (ltc_cache's, the
    program signing key's, Inductor's, Python's bytecode) in ``directory``,
    one thread."""
    env = dict(os.environ)
    env.update({
        "LTC_CACHE_DIR": str(directory / "ltc"),
        "XDG_CONFIG_HOME": str(directory / "config"),
        "TORCHINDUCTOR_CACHE_DIR": str(directory / "inductor"),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
        "OMP_NUM_THREADS": "1",
        # Inductor compiles in this process rather than in a pool of worker
        # processes, whose start-up would dominate these small graphs.
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
        # Start-up figures of the TorchScript tier: no background worker
        # compiling beside the measured process (python -m tools.bench.fused
        # measures the fused tier).
        "LTC_CACHE_FUSE": "off",
    })
    for name in ("LTC_CACHE_DISABLE", "LTC_CACHE_READONLY", "LTC_CACHE_REMOTE"):
        env.pop(name, None)
    return with_import_roots(bytecode_as_installed(env, directory))


def bytecode_as_installed(env: dict[str, str], directory: Path) -> dict[str, str]:
    """``env`` where a process runs ltc_cache as an installed package runs:
    its bytecode compiled once (by the first process, under ``directory``),
    as torch's and transformers' already are, even where the environment
    sets PYTHONDONTWRITEBYTECODE."""
    env["PYTHONPYCACHEPREFIX"] = str(directory / "pycache")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def tool_argv(tool: str, *args: str) -> list[str]:
    """The command line that runs the tool ``tools.<tool>`` as a module
    (``tool_argv("bench.fused", ...)``: ``python -m tools.bench.fused ...``)."""
    return [sys.executable, "-m", f"tools.{tool}", *args]


def child_result(proc: subprocess.CompletedProcess[str]) -> dict:
    """A child's JSON report (the last line it printed), or why it failed."""
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        return {"failed": tail[0][:200]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_child(argv: list[str], env: dict[str, str], timeout: float = 1800) -> dict:
    """Run ``argv`` in a fresh process; its JSON report, or why it failed."""
    return child_result(subprocess.run(argv, capture_output=True, text=True, env=env,
                                       timeout=timeout))


def cold_then_warm(argv: list[str], env: dict[str, str], warm_argv: list[str] | None = None,
                   timeout: float = 1800) -> tuple[dict, dict]:
    """Two fresh processes over the caches ``env`` names: the cold one, then
    the warm one (``warm_argv``, where it runs something else: other
    lengths, another seed). Their reports."""
    cold = run_child(argv, env, timeout)
    return cold, run_child(warm_argv or argv, env, timeout)


def median(runs: list[dict], field: str) -> float | None:
    """The median of ``field`` over the runs that have it (None: none has)."""
    values = [r[field] for r in runs if field in r]
    return statistics.median(values) if values else None


def largest(runs: list[dict], field: str, default: float | None = None) -> float | None:
    """The largest ``field`` over the runs (a run without it counts 0);
    ``default`` where there are no runs. For counts a warm run must keep at 0."""
    return max((r.get(field, 0) for r in runs), default=default)


def add_runs(row: dict, runs: dict[str, list[dict]], medians: dict[str, str]) -> None:
    """Into ``row``, for each label of ``runs``: its first failure, the
    median of each run field ``medians`` names (``{"s": "first_s"}`` writes
    ``{label}_s``) and the largest error."""
    for label, results in runs.items():
        failed = [r["failed"] for r in results if "failed" in r]
        if failed:
            row[f"{label}_failed"] = failed[0]
        for suffix, field in medians.items():
            row[f"{label}_{suffix}"] = median(results, field)
        row[f"{label}_max_error"] = max((r["max_error"] for r in results
                                         if "max_error" in r), default=None)


def seconds(value: float | None) -> str:
    return "failed" if value is None else f"{value:.2f} s"


def ratio(a: float | None, b: float | None, suffix: str = "") -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}{suffix}"


def table(rows: list[list[str]]) -> str:
    """Rows of cells (the first row the header) -> aligned Markdown."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
             for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)
