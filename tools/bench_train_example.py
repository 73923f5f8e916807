"""The README's training command run twice: ``examples/train.py`` cold, then
warm over the same cache directory, in fresh processes, side by side.

    python tools/bench_train_example.py [--pairs 3] [--steps 3] [--compile ltc_cache|torch]

Each pair is a new scratch directory (ltc_cache's cache and the program
signing key): one cold process, then one warm. The time is the example's
own ``first_step_s``, from the compiled model's first call to the end of
the first AdamW step (capture, loading and compiling included). It prints
the medians over the pairs, warm/cold, and what each warm run did:
LTC traces, AOTAutograd traces, programs loaded, Dynamo frames captured.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_compile import child_env, child_result, median, ratio, seconds  # tools/ is sys.path[0]

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train.py"


def run(directory: Path, steps: int, compiler: str) -> dict:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--steps", str(steps), "--no-eager", "--json",
         "--compile", compiler],
        capture_output=True, text=True, env=child_env(directory), timeout=900)
    return child_result(proc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--compile", choices=("ltc_cache", "torch"), default="ltc_cache")
    args = parser.parse_args(argv)
    colds, warms = [], []
    with tempfile.TemporaryDirectory(prefix="bench-train-example-") as scratch:
        for i in range(args.pairs):
            directory = Path(scratch) / str(i)
            colds.append(run(directory, args.steps, args.compile))
            warms.append(run(directory, args.steps, args.compile))
    cold, warm = median(colds, "first_step_s"), median(warms, "first_step_s")
    print(f"examples/train.py --compile {args.compile}, {args.pairs} cold/warm pairs: "
          f"first step cold {seconds(cold)}, warm {seconds(warm)}, "
          f"warm/cold {ratio(warm, cold)}")
    for w in warms:
        if "failed" in w:
            print(f"  warm run failed: {w['failed']}")
            continue
        print(f"  warm: {w['first_step_s']:.3f} s; traces {w['traces']}, AOTAutograd traces "
              f"{w.get('aot_traces', '?')}, programs loaded {w['program_hits']}, Dynamo frames "
              f"{w['frames_captured']}; loss digest {w['loss_digest']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
