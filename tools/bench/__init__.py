"""The benchmarks, one a module (``python -m tools.bench.<name> --help``
from the repository root): each answers one question, most of them into a
results file of benchmarks/results/ (``--results``). A benchmark's child
side, what its fresh processes run, sits beside it (``<name>_child.py``);
one of several parts is a folder (``fused/``, ``replay/``: its
``__main__.py`` the command, the other modules its parts)."""
