"""Tiny language models for generation, and a child process that serves
``generate()`` requests through ltc_cache against eager.

``python tests/generate_child.py MODEL --lengths 5,9 [--route forward]
[--cache static] [--then-sample] [--new 16]`` prints one JSON
line: each request's tokens (and eager's, for greedy decoding), its time
(``--then-sample``: a sampled request of the first length after the
greedy ones, in the same process), and the
process's counters (ltc_cache's, Dynamo's captures). Random weights from a
fixed seed, tiny configs, no downloads. ``tools/bench_generate.py`` and
``tests/program/test_generate.py`` run it in fresh processes, cold then warm.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

VOCAB = 128
# Positions the models have: room for a 200-token prompt and its answer
# (tools/bench_generate.py).
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


def compiled(model: torch.nn.Module, route: str) -> Callable[..., Any]:
    """``model.generate`` with the forward compiled the way ``route`` says."""
    import ltc_cache

    if route == "eager":
        return model.generate
    if route == "forward":  # the README's recipe
        model.forward = ltc_cache.compile(model.forward)
        return model.generate
    if route == "torch":
        model.forward = torch.compile(model.forward, backend="ltc_cache")
        return model.generate
    if route == "module":
        return ltc_cache.compile(model).generate
    if route == "inductor":
        model.forward = torch.compile(model.forward)
        return model.generate
    raise SystemExit(f"unknown route {route!r}")


def captures() -> int:
    """Dynamo captures in this process: frames torch.compile captured, and
    programs ltc_cache.compile captured (AOT precompile, which Dynamo's
    frame counters do not count)."""
    from torch._dynamo.utils import counters

    import ltc_cache

    return int(counters["frames"].get("ok", 0)) + ltc_cache.stats().get("program_captures", 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", choices=MODELS)
    parser.add_argument("--lengths", default="5,9", help="prompt lengths, one request each")
    parser.add_argument("--route", default="forward",
                        choices=("eager", "forward", "torch", "module", "inductor"))
    parser.add_argument("--cache", default="dynamic", choices=("dynamic", "static"))
    parser.add_argument("--then-sample", action="store_true",
                        help="one sampled request after the greedy ones")
    parser.add_argument("--new", type=int, default=8, help="new tokens per request")
    parser.add_argument("--no-check", action="store_true", help="skip eager's tokens")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore", UserWarning)  # transformers' config notes

    import ltc_cache
    from ltc_cache.program.buckets import Buckets, pad_generate

    lengths = [int(n) for n in args.lengths.split(",")]
    model = build(args.model)
    kwargs = generation_kwargs(args.cache, False, args.new)
    expected, padded = {}, {}
    if not args.no_check:
        with torch.no_grad():
            for n in lengths:
                expected[n] = model.generate(prompt(n), **kwargs).tolist()
                # What eager makes of the prompt padded as the compiled
                # module's generate() pads it (cut back the same way).
                padded[n] = pad_generate(Buckets(), model, (prompt(n),), dict(kwargs),
                                         model.generate).tolist()
    generate = compiled(model, args.route)
    # (length, generate's arguments, eager's tokens or None)
    runs = [(n, kwargs, expected.get(n)) for n in lengths]
    if args.then_sample:
        runs.append((lengths[0], generation_kwargs(args.cache, True, args.new), None))
    requests, warned = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        for n, request_kwargs, eager in runs:
            torch.manual_seed(n)
            start = time.perf_counter()
            with torch.no_grad():
                tokens = generate(prompt(n), **request_kwargs).tolist()
            requests.append({"length": n, "seconds": time.perf_counter() - start,
                             "tokens": tokens, "eager": eager,
                             "eager_padded": padded.get(n) if eager else None})
    warned = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    print(json.dumps({"requests": requests, "stats": ltc_cache.stats(),
                      "captures": captures(), "warnings": warned}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
