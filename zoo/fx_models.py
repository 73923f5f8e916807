"""Models FX traces whole, for replay's steady state and warm start: MLPs
of residual blocks (``mlp32``, ``mlp128``; ``mlp128ln`` with LayerNorm and
GELU, a transformer's feed-forward half) and a TransformerEncoder of four
layers (``transformer``), built by ``build(name, width)`` in ``eval()`` with
their example input; ``TenInTenOut``, ten inputs and ten outputs of one
multiply each. Random weights from seed 0."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


class NormBlock(nn.Module):
    """LayerNorm, Linear, GELU, Linear and a residual add: a transformer's
    feed-forward half."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class Mlp(nn.Module):
    """``blocks`` residual blocks of two Linear layers: per block two addmm
    with transposed weights and three captured scalars (alpha, beta, the
    residual add's alpha), as in docs/torch/ltc.md#views-are-lowered-to-copies,
    docs/torch/ltc.md#binding-by-path-costs-more-than-replay-gains and
    docs/torch/ltc.md#warm-start-floor-grows-with-nodes."""

    def __init__(self, blocks: int, width: int, block: type[nn.Module] = Block) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[block(width) for _ in range(blocks)])

    def forward(self, x):
        return self.blocks(x)


class EncoderLayer(nn.TransformerEncoderLayer):
    """A TransformerEncoderLayer whose attention asks for its weights: the
    default path (scaled_dot_product_attention) uses ops LTC's TorchScript
    backend does not lower (``_safe_softmax``: isneginf, all, where), so the
    whole graph would not be one LTC graph."""

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal=False):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           need_weights=True)[0]
        return self.dropout1(x)


class Transformer(nn.Module):
    """A torch.nn.TransformerEncoder of four layers. Wrapped, since FX cannot
    trace its forward (mask checks); to FX it is a leaf module, run by
    ``functional_call`` on lazy tensors at trace time."""

    def __init__(self, width: int) -> None:
        super().__init__()
        layer = EncoderLayer(width, nhead=4, dim_feedforward=2 * width, dropout=0.0,
                             batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False)

    def forward(self, x):
        return self.encoder(x)


def build(name: str, width: int) -> tuple[nn.Module, list[torch.Tensor]]:
    torch.manual_seed(0)
    if name == "mlp32":
        return Mlp(32, width).eval(), [torch.randn(16, width)]
    if name == "mlp128":
        return Mlp(128, width).eval(), [torch.randn(16, width)]
    if name == "mlp128ln":
        return Mlp(128, width, NormBlock).eval(), [torch.randn(8, width)]
    if name == "transformer":
        return Transformer(width).eval(), [torch.randn(4, 32, width)]
    raise SystemExit(f"unknown model {name}")


class TenInTenOut(nn.Module):
    def forward(self, a, b, c, d, e, f, g, h, i, j):
        return a * a, b * b, c * c, d * d, e * e, f * f, g * g, h * h, i * i, j * j
