"""timm's models, the vision half of PyTorch's Dynamo benchmark suites
(``benchmarks/dynamo/timm_models_list.txt``), built small: random weights,
no downloads, 4 classes, images as small as each model allows and, where
its constructor takes them, fewer blocks, so that a model traces in
seconds while keeping its kinds of layers (the ops partitioning sees).

``TIMM`` maps each name to its builder, which returns ``(model, kwargs)``
as :mod:`zoo.suite_models`' builders do (timm's forward takes ``x``).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from zoo import torchvision_ops

BATCH = 2


def import_timm() -> types.ModuleType:
    """``import timm``, with torchvision imported as
    :mod:`zoo.torchvision_ops` allows beside torch's CPU build."""
    torchvision_ops.install()
    import timm

    return timm


def _timm(name: str, size: int, **settings: Any) -> Callable[[], tuple[torch.nn.Module, dict]]:
    def builder() -> tuple[torch.nn.Module, dict]:
        timm = import_timm()
        model = timm.create_model(name, pretrained=False, num_classes=4, drop_rate=0.0,
                                  **settings)
        return model, {"x": torch.randn(BATCH, 3, size, size)}

    builder.__name__ = name
    return builder


# drop_rate=0 (GhostNet's classifier drops 0.2 by default) and drop-path 0
# (Swin's is 0.1 by default): a training step compared with eager draws no
# masks. DenseNet's four dense blocks and LeViT's three stages keep every
# kind of layer at 2 and 1 blocks each (their full 6-12-24-16 and 2-3-4
# traced in 33 s and 16 s, most of the test suite's timm sweep).
TIMM: dict[str, Callable[[], tuple[torch.nn.Module, dict]]] = {
    "resnet18": _timm("resnet18", 64),
    "efficientnet_b0": _timm("efficientnet_b0", 64),
    "convnext_atto": _timm("convnext_atto", 64),
    "regnetx_002": _timm("regnetx_002", 64),
    "mixer_b16_224": _timm("mixer_b16_224", 64, img_size=64),
    "densenet121": _timm("densenet121", 64, block_config=(2, 2, 2, 2)),
    "ghostnet_100": _timm("ghostnet_100", 64),
    "levit_128s": _timm("levit_128s", 64, img_size=64, depth=(1, 1, 1)),
    "swin_tiny_patch4_window7_224": _timm("swin_tiny_patch4_window7_224", 64, img_size=64,
                                          window_size=4, depths=(2, 2, 2, 2), drop_path_rate=0.0),
    "vit_tiny_patch16_224": _timm("vit_tiny_patch16_224", 64, img_size=64, depth=4),
    # DeiT is timm's ViT; the distilled one (the suite's) adds a token and a head.
    "deit_tiny_distilled_patch16_224": _timm("deit_tiny_distilled_patch16_224", 64, img_size=64,
                                             depth=4),
}
