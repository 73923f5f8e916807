"""Benchmarks and profiles of ltc_cache, each answering one question; run
from the repository root as ``python -m tools.bench.<name> --help`` (the
benchmarks, tools/bench/), ``python -m tools.profile_overhead`` and
``python -m tools.render_benchmarks`` (BENCHMARKS.md from the results).
What they share (measured child processes, cold then warm runs, medians,
tables) is in ``tools/harness.py``, the results files in
``tools/results.py``; the models they build come from ``zoo``."""

from zoo import torchvision_ops

# torchvision (timm's, from the test extra) importable beside torch's CPU
# build in a tool's own process too (its children: tests/sitecustomize.py).
torchvision_ops.install()
