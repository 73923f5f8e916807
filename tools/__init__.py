"""Benchmarks and profiles of ltc_cache, each answering one question; run
from the repository root as ``python -m tools.<name> --help``. What they
share (measured child processes, cold then warm runs, medians, tables) is
in ``tools/harness.py``; the models they build come from ``zoo``."""
