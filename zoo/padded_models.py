"""Tiny causal language models in ``train()`` (GPT-2, Llama; random
weights from seed 0, no dropout, no downloads) and the batches dynamic
padding makes for them: four sequences padded to one length, one of them
shorter (attention mask 0, labels -100), as a collator pads them; and
the lengths a run's batches are drawn at."""

from __future__ import annotations

import random

import torch

VOCAB = 128


def build(name: str) -> torch.nn.Module:
    """``name``'s tiny causal language model, weights from seed 0, no dropout."""
    import transformers as t

    torch.manual_seed(0)
    if name == "gpt2":
        config = t.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=128,
                              pad_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        return t.GPT2LMHeadModel(config).train()
    config = t.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=128, vocab_size=VOCAB,
                           max_position_embeddings=128, pad_token_id=0)
    return t.LlamaForCausalLM(config).train()


def batch(length: int, step: int) -> dict[str, torch.Tensor]:
    """Four sequences padded to ``length``: the first is a third shorter."""
    gen = torch.Generator().manual_seed(length * 7 + step)
    ids = torch.randint(3, VOCAB, (4, length), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, length - length // 3:] = 0
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask,
            "labels": ids.masked_fill(mask == 0, -100)}


def train_lengths(seed: int) -> list[int]:
    """Ten batch lengths from 8-64, drawn with ``seed``: a training run's
    batches, each padded to its longest sequence."""
    draw = random.Random(seed)
    return [draw.randint(8, 64) for _ in range(10)]
