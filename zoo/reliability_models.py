"""Small MLPs for the reliability tests, traced by FX, with fixed weights
and their example inputs (``build(name)``), one per row of ``MODELS``."""

from __future__ import annotations

import torch
from torch import fx, nn

# name -> (depth, width, batch, scale). "deep" has ~43 KB of IR: diskcache
# keeps it in a file of its own (values >= 32 KB), the others inside its
# database. A scale is a scalar the trace captures: a stored constant.
MODELS = {
    "mlp1": (1, 8, 2, None),
    "mlp2": (2, 8, 2, None),
    "mlp2-wide": (2, 16, 2, None),
    "mlp2-batch3": (2, 8, 3, None),
    "scaled": (2, 8, 2, 2.5),
    "deep": (200, 4, 2, None),
}


class _Scaled(nn.Module):
    def __init__(self, body: nn.Module, scale: float) -> None:
        super().__init__()
        self.body = body
        self.scale = scale

    def forward(self, x):
        return self.body(x) * self.scale + 1


def build(name: str) -> tuple[fx.GraphModule, list[torch.Tensor]]:
    """The model ``name`` with fixed weights, and its example input."""
    depth, width, batch, scale = MODELS[name]
    gen = torch.Generator().manual_seed(depth * 1000 + width)
    layers: list[nn.Module] = []
    for _ in range(depth):
        linear = nn.Linear(width, width)
        with torch.no_grad():
            linear.weight.copy_(torch.randn(width, width, generator=gen) / width ** 0.5)
            linear.bias.copy_(torch.randn(width, generator=gen))
        layers += [linear, nn.ReLU()]
    model: nn.Module = nn.Sequential(*layers)
    if scale is not None:
        model = _Scaled(model, scale)
    gm = fx.symbolic_trace(model).eval()
    return gm, [torch.randn(batch, width, generator=gen)]
