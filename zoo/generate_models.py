"""Tiny language models for ``generate()``: the decoder models of the
suites and one encoder-decoder, at tiny configs with random weights from
seed 0 (no downloads); a request's prompt, and ``generate()``'s arguments
with a static cache of fixed length."""

from __future__ import annotations

from typing import Any

import torch

VOCAB = 128
# Positions the models have: room for a 200-token prompt and its answer
# (tools/bench/generate.py).
POSITIONS = 256
# The decoder models of the suites and one encoder-decoder.
MODELS = ("gpt2", "llama", "mistral", "qwen2", "opt", "gptj", "phi", "gemma", "t5")


def _config(name: str) -> Any:
    import transformers as t

    common = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    decoder = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                   intermediate_size=128, max_position_embeddings=POSITIONS, **common)
    if name == "gpt2":
        return t.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=POSITIONS, **common)
    if name == "llama":
        return t.LlamaConfig(num_key_value_heads=2, **decoder)
    if name == "mistral":
        return t.MistralConfig(num_key_value_heads=2, sliding_window=None, **decoder)
    if name == "qwen2":
        return t.Qwen2Config(num_key_value_heads=2, **decoder)
    if name == "opt":
        return t.OPTConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                           ffn_dim=128, word_embed_proj_dim=64, max_position_embeddings=POSITIONS,
                           **common)
    if name == "gptj":
        return t.GPTJConfig(n_layer=2, n_embd=64, n_head=4, rotary_dim=8, n_positions=POSITIONS,
                            **common)
    if name == "phi":
        return t.PhiConfig(**decoder)
    if name == "gemma":
        return t.GemmaConfig(num_key_value_heads=1, head_dim=16, **decoder)
    if name == "t5":
        return t.T5Config(num_layers=2, d_model=64, d_kv=16, num_heads=4, d_ff=128,
                          decoder_start_token_id=0, **common)
    raise SystemExit(f"unknown model {name!r}; one of {', '.join(MODELS)}")


def build(name: str) -> torch.nn.Module:
    """``name``'s tiny model, in eval mode, with weights from seed 0."""
    import transformers as t

    config = _config(name)
    torch.manual_seed(0)
    if name == "t5":
        model = t.T5ForConditionalGeneration(config)
    else:
        model = t.AutoModelForCausalLM.from_config(config)
    return model.eval()


def prompt(length: int, seed: int = 0) -> torch.Tensor:
    """One request's prompt: ``length`` token ids (no special tokens)."""
    gen = torch.Generator().manual_seed(1000 + length + seed)
    return torch.randint(3, VOCAB, (1, length), generator=gen)


# The static cache's length, fixed for the fleet: generate() otherwise sizes
# it to each request (prompt + new tokens, at least the largest so far), so
# the decoding graphs would depend on the order requests came in.
MAX_CACHE_LEN = 64


def generation_kwargs(cache: str, sample: bool, new_tokens: int,
                      cache_len: int = MAX_CACHE_LEN) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                  do_sample=sample, pad_token_id=0)
    if sample:
        kwargs.update(top_k=20, temperature=0.9)
    if cache == "static":
        kwargs.update(cache_implementation="static", max_cache_len=cache_len)
    return kwargs
