"""torchvision imported where its compiled ops do not load.

timm (a test extra) imports torchvision, and so does transformers wherever
torchvision is installed. torchvision's compiled ops (``_C.so``) link the
CUDA libraries of the torch they were built for: beside torch's CPU build
they do not load (torchvision notes that and goes on), but its two modules
that register fake and autograd kernels for those ops then raise at import
(``operator torchvision::nms does not exist``), and with them ``import
torchvision``, ``import timm`` and transformers' models. Where the ops did
not load, :func:`install` has those two modules imported empty: they
register kernels for ops that do not exist in the process, and neither
timm's models nor transformers' use those ops.

Imports nothing heavy (no torch): ``tests/sitecustomize.py`` installs it in
every test process and child at startup.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

__all__ = ["install"]

# The modules that register kernels for torchvision's compiled ops.
_REGISTRATIONS = frozenset({"torchvision._meta_registrations",
                            "torchvision._autograd_registrations"})


class _WithoutOps(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the two registration modules empty where torchvision's ops did
    not load (its ``extension`` module, imported before them, says so)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _REGISTRATIONS:
            return None
        extension = sys.modules.get("torchvision.extension")
        if extension is None or extension._has_ops():
            return None  # the ops loaded: torchvision registers its kernels
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        return types.ModuleType(spec.name, "skipped: torchvision's compiled ops did not load")

    def exec_module(self, module):
        pass


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _WithoutOps) for finder in sys.meta_path):
        sys.meta_path.insert(0, _WithoutOps())
