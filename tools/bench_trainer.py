"""The training loops people already use, cold then warm, side by side:
transformers' ``Trainer`` (``examples/trainer.py``) and a hand-written
loop whose first iteration is an evaluation plus the first step.

    python tools/bench_trainer.py [--models gpt2,bert] [--steps 6] [--pairs 1]
        [--modes ltc_cache,inductor,eager] [--script-modes ltc_cache,torch,inductor,eager]

Each (loop, model, mode) gets new scratch directories (ltc_cache's cache,
the program signing key, Inductor's caches with its FX graph and
AOTAutograd caches on): one cold process, then one warm, both with one
thread. ``ltc_cache`` is ``Trainer(model=ltc_cache.compile(model))``,
``inductor`` is ``TrainingArguments(torch_compile=True)``, ``torch`` is
``torch.compile(model, backend="ltc_cache")``, ``eager`` no compiler.
Times are the example's own: the first step (compiling or loading
included), the median step from the third on, and for the script loop the
first iteration (evaluation plus first step). Prints a Markdown table and,
per model, the warm first step of ltc_cache over Inductor's warm one.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_compile import child_env, child_result, ratio, seconds  # tools/ is sys.path[0]
from markdown_table import table

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "trainer.py"


def run(directory: Path, loop: str, model: str, mode: str, steps: int) -> dict:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--loop", loop, "--model", model, "--compile", mode,
         "--steps", str(steps), "--json"],
        capture_output=True, text=True, env=child_env(directory), timeout=1800)
    return child_result(proc)


def median(runs: list[dict], field: str) -> float | None:
    values = [r[field] for r in runs if field in r]
    return statistics.median(values) if values else None


def measure(loop: str, model: str, mode: str, steps: int, pairs: int,
            scratch: Path) -> dict:
    colds, warms = [], []
    for i in range(pairs):
        directory = Path(tempfile.mkdtemp(prefix=f"{loop}-{model}-{mode}-{i}-", dir=scratch))
        colds.append(run(directory, loop, model, mode, steps))
        warms.append(run(directory, loop, model, mode, steps))
    first = "first_iteration_s" if loop == "script" else "first_step_s"
    warm = next((w for w in warms if "failed" not in w), warms[-1])
    stats = warm.get("stats", {})
    return {
        "loop": loop, "model": model, "mode": mode,
        "cold_first": median(colds, first), "warm_first": median(warms, first),
        "cold_steady": median(colds, "steady_step_s"),
        "warm_steady": median(warms, "steady_step_s"),
        "failed": next((r["failed"] for r in colds + warms if "failed" in r), None),
        "warm_did": (f"{stats.get('traces', 0)} / {stats.get('aot_traces', 0)} / "
                     f"{warm.get('frames_captured', '?')} / {stats.get('program_hits', 0)}"
                     if stats else f"- / - / {warm.get('frames_captured', '?')} / -"),
        "losses": warm.get("losses"),
    }


def markdown(rows: list[dict]) -> str:
    cells = [["loop", "model", "mode", "first step cold", "first step warm", "steady cold",
              "steady warm", "warm: LTC traces / AOT traces / Dynamo frames / programs"]]
    for r in rows:
        cells.append([r["loop"], r["model"], r["mode"], seconds(r["cold_first"]),
                      f"**{seconds(r['warm_first'])}**" if r["mode"] == "ltc_cache"
                      else seconds(r["warm_first"]),
                      _ms(r["cold_steady"]), _ms(r["warm_steady"]), r["warm_did"]])
    return table(cells)


def _ms(value: float | None) -> str:
    return "failed" if value is None else f"{value * 1e3:.1f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2,bert")
    parser.add_argument("--modes", default="ltc_cache,inductor,eager")
    parser.add_argument("--script-modes", default="ltc_cache,torch,inductor,eager",
                        help="modes of the hand-written loop (gpt2); '' for none")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--pairs", type=int, default=1)
    args = parser.parse_args(argv)
    plan = [("trainer", m, mode) for m in args.models.split(",") for mode in args.modes.split(",")]
    plan += [("script", "gpt2", mode) for mode in args.script_modes.split(",") if mode]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as scratch:
        for loop, model, mode in plan:
            row = measure(loop, model, mode, args.steps, args.pairs, Path(scratch))
            rows.append(row)
            print(f"{loop} {model} {mode}: first step cold {seconds(row['cold_first'])}, warm "
                  f"{seconds(row['warm_first'])}; steady warm {_ms(row['warm_steady'])}"
                  + (f"; FAILED {row['failed']}" if row["failed"] else ""), flush=True)
    print()
    print(markdown(rows))
    print()
    for loop in ("trainer", "script"):
        for model in args.models.split(","):
            got = {r["mode"]: r for r in rows if (r["loop"], r["model"]) == (loop, model)}
            if "ltc_cache" in got and "inductor" in got:
                ltc, inductor = got["ltc_cache"], got["inductor"]
                print(f"{loop} {model}: warm first step ltc_cache / Inductor warm = "
                      f"{ratio(ltc['warm_first'], inductor['warm_first'], 'x')}; "
                      f"ltc_cache warm / cold = {ratio(ltc['warm_first'], ltc['cold_first'], 'x')}")
            same = {mode: r["losses"] for mode, r in got.items() if r["losses"]}
            if "eager" in same:
                equal = ", ".join(f"{mode} {losses == same['eager']}"
                                  for mode, losses in same.items() if mode != "eager")
                print(f"  warm losses bit for bit equal to eager's: {equal}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
