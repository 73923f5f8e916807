"""The training loops people already use, cold then warm, side by side:
transformers' ``Trainer`` (``examples/trainer.py``) and a hand-written
loop whose first iteration is an evaluation plus the first step; or
(``--example``) the README's training command, ``examples/train.py``.

    python -m tools.bench.trainer [--models gpt2,bert] [--steps 6] [--pairs 1]
        [--modes ltc_cache,inductor,eager] [--script-modes ltc_cache,torch,inductor,eager]
    python -m tools.bench.trainer --steps 6 --results   # into benchmarks/results/trainer.json
    python -m tools.bench.trainer --example [--pairs 3] [--steps 3] [--compile ltc_cache|torch]

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

``--example``: ``examples/train.py`` cold, then warm over the same cache
directory, ``--pairs`` times (each pair a new scratch directory for
ltc_cache's cache and the program signing key), compiled as ``--compile``
says. The time is the example's own ``first_step_s``, from the compiled
model's first call to the end of the first AdamW step (capture, loading
and compiling included). It prints the medians over the pairs, warm/cold,
and what each warm run did: LTC traces, AOTAutograd traces, programs
loaded, Dynamo frames captured.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tools.harness import ROOT, child_env, cold_then_warm, median, ratio, seconds, table
from tools.results import Recorder, add_arguments, rounded

EXAMPLE = ROOT / "examples" / "trainer.py"
TRAIN_EXAMPLE = ROOT / "examples" / "train.py"


def measure(loop: str, model: str, mode: str, steps: int, pairs: int,
            scratch: Path) -> dict:
    colds, warms = [], []
    argv = [sys.executable, str(EXAMPLE), "--loop", loop, "--model", model, "--compile", mode,
            "--steps", str(steps), "--json"]
    for i in range(pairs):
        directory = Path(tempfile.mkdtemp(prefix=f"{loop}-{model}-{mode}-{i}-", dir=scratch))
        cold, warm = cold_then_warm(argv, child_env(directory))
        colds.append(cold)
        warms.append(warm)
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


def results_rows(rows: list[dict]) -> list[dict]:
    """trainer.json's ``loops`` rows."""
    return [{"loop": r["loop"], "model": r["model"], "mode": r["mode"],
             "first_step_cold_s": rounded(r["cold_first"]),
             "first_step_warm_s": rounded(r["warm_first"]),
             "steady_cold_ms": rounded(r["cold_steady"], 1, 1e3),
             "steady_warm_ms": rounded(r["warm_steady"], 1, 1e3),
             "warm_counts": r["warm_did"]} for r in rows]


def _ms(value: float | None) -> str:
    return "failed" if value is None else f"{value * 1e3:.1f} ms"


def train_example(pairs: int, steps: int, compiler: str) -> None:
    """``--example``: examples/train.py cold then warm, ``pairs`` times."""
    colds, warms = [], []
    argv = [sys.executable, str(TRAIN_EXAMPLE), "--steps", str(steps), "--no-eager", "--json",
            "--compile", compiler]
    with tempfile.TemporaryDirectory(prefix="bench-train-example-") as scratch:
        for i in range(pairs):
            cold, warm = cold_then_warm(argv, child_env(Path(scratch) / str(i)), timeout=900)
            colds.append(cold)
            warms.append(warm)
    cold, warm = median(colds, "first_step_s"), median(warms, "first_step_s")
    print(f"examples/train.py --compile {compiler}, {pairs} cold/warm pairs: "
          f"first step cold {seconds(cold)}, warm {seconds(warm)}, "
          f"warm/cold {ratio(warm, cold)}")
    for w in warms:
        if "failed" in w:
            print(f"  warm run failed: {w['failed']}")
            continue
        print(f"  warm: {w['first_step_s']:.3f} s; traces {w['traces']}, AOTAutograd traces "
              f"{w.get('aot_traces', '?')}, programs loaded {w['program_hits']}, Dynamo frames "
              f"{w['frames_captured']}; loss digest {w['loss_digest']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.trainer",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2,bert")
    parser.add_argument("--modes", default="ltc_cache,inductor,eager")
    parser.add_argument("--script-modes", default="ltc_cache,torch,inductor,eager",
                        help="modes of the hand-written loop (gpt2); '' for none")
    parser.add_argument("--steps", type=int, default=None, help="default 6 (--example: 3)")
    parser.add_argument("--pairs", type=int, default=None, help="default 1 (--example: 3)")
    parser.add_argument("--example", action="store_true",
                        help="examples/train.py (the README's training command) instead")
    parser.add_argument("--compile", choices=("ltc_cache", "torch"), default="ltc_cache",
                        help="with --example: what compiles the model")
    add_arguments(parser, "trainer")
    args = parser.parse_args(argv)
    recorder = Recorder.from_args("tools.bench.trainer", args, argv)
    if recorder and args.example:
        parser.error("--results writes the loops table; --example has none")
    steps, pairs = (3, 3) if args.example else (6, 1)
    args.steps = steps if args.steps is None else args.steps
    args.pairs = pairs if args.pairs is None else args.pairs
    if args.example:
        train_example(args.pairs, args.steps, args.compile)
        return 0
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
    if recorder:
        # A run of some loops, models or modes refreshes those rows only.
        recorder.write("trainer", [{"id": "loops", "rows": results_rows(rows)}], threads=1,
                       merge_on={"loops": ("loop", "model", "mode")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
