"""timm's models, the vision half of PyTorch's Dynamo benchmark suites
(``benchmarks/dynamo/timm_models_list.txt``), built small: random weights,
no downloads, 4 classes, images as small as each model allows and, where
its constructor takes them, fewer blocks, so that a model traces in
seconds while keeping its kinds of layers (the ops partitioning sees).

``TIMM`` maps each name to its builder, which returns ``(model, kwargs)``
as :mod:`zoo.suite_models`' builders do (timm's forward takes ``x``).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

BATCH = 2


def import_timm() -> types.ModuleType:
    """``import timm``, which imports torchvision, whose compiled ops
    (``_C.so``) link the CUDA libraries of the torch they were built for:
    beside torch's CPU build they do not load, and torchvision's modules
    that register fake and autograd kernels for those ops then raise at
    import (``operator torchvision::nms does not exist``). Where the ops do
    not load, those two modules are skipped: they register kernels for ops
    that do not exist in the process, and timm's models use none of them."""
    if "timm" in sys.modules:
        return sys.modules["timm"]
    if "torchvision" not in sys.modules and not _torchvision_ops_load():
        for name in ("_meta_registrations", "_autograd_registrations"):
            sys.modules.setdefault(f"torchvision.{name}",
                                   types.ModuleType(f"torchvision.{name}"))
    import timm

    return timm


def _torchvision_ops_load() -> bool:
    """Whether torchvision's compiled ops load beside this torch (True where
    torchvision is not installed: ``import timm`` then fails as it would)."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return True
    for location in spec.submodule_search_locations:
        for library in Path(location).glob("_C*.so"):
            try:
                torch.ops.load_library(str(library))
                return True
            except (ImportError, OSError):
                return False
    return True


def _timm(name: str, size: int, **settings: Any) -> Callable[[], tuple[torch.nn.Module, dict]]:
    def builder() -> tuple[torch.nn.Module, dict]:
        timm = import_timm()
        model = timm.create_model(name, pretrained=False, num_classes=4, drop_rate=0.0,
                                  **settings)
        return model, {"x": torch.randn(BATCH, 3, size, size)}

    builder.__name__ = name
    return builder


# drop_rate=0 (GhostNet's classifier drops 0.2 by default) and drop-path at
# its default of 0: a training step compared with eager draws no masks.
TIMM: dict[str, Callable[[], tuple[torch.nn.Module, dict]]] = {
    "resnet18": _timm("resnet18", 64),
    "efficientnet_b0": _timm("efficientnet_b0", 64),
    "convnext_atto": _timm("convnext_atto", 64),
    "regnetx_002": _timm("regnetx_002", 64),
    "mixer_b16_224": _timm("mixer_b16_224", 64, img_size=64),
    "densenet121": _timm("densenet121", 64),
    "ghostnet_100": _timm("ghostnet_100", 64),
    "levit_128s": _timm("levit_128s", 64, img_size=64),
    "swin_tiny_patch4_window7_224": _timm("swin_tiny_patch4_window7_224", 64, img_size=64,
                                          window_size=4, depths=(2, 2, 2, 2)),
    "vit_tiny_patch16_224": _timm("vit_tiny_patch16_224", 64, img_size=64, depth=4),
}
