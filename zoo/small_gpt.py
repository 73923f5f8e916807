"""A small GPT: the model of a well-known minimal GPT training
script, written here from its description (pre-norm blocks, LayerNorm with no
bias, causal ``scaled_dot_product_attention``, exact GELU, a language-model
head that shares the token embedding), at 4 layers, width 128, 4 heads, no
bias, dropout 0, and trained on batches of 8 x 64 tokens."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

WIDTH, LAYERS, HEADS, SEQUENCE, BATCH, VOCAB = 128, 4, 4, 64, 8, 65


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.proj = nn.Linear(WIDTH, WIDTH, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(WIDTH, dim=2)
        q, k, v = (y.view(b, t, HEADS, c // HEADS).transpose(1, 2) for y in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(WIDTH, bias=False)
        self.attn = _Attention()
        self.ln_2 = nn.LayerNorm(WIDTH, bias=False)
        self.fc = nn.Linear(WIDTH, 4 * WIDTH, bias=False)
        self.out = nn.Linear(4 * WIDTH, WIDTH, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.out(F.gelu(self.fc(self.ln_2(x))))


class SmallGPT(nn.Module):
    """Returns ``(logits,)``, as the ``transformers`` models return a tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.wpe = nn.Embedding(SEQUENCE, WIDTH)
        self.blocks = nn.ModuleList(_Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH, bias=False)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.wte.weight  # tied, as the script ties them

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor]:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        return (self.head(self.ln_f(x)),)


def small_gpt() -> tuple[SmallGPT, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return SmallGPT().eval(), (torch.randint(0, VOCAB, (BATCH, SEQUENCE)),)
