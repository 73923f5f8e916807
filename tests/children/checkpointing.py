"""A separate process for tests/program/test_checkpointing.py: a tiny
transformers model with gradient checkpointing on (the setting most
fine-tuning turns on), trained through ``ltc_cache.compile`` with
micro-batches accumulated and AdamW, beside an eager copy with
checkpointing on too.

``python tests/children/checkpointing.py gpt2|llama [--reentrant] [--steps 2]
[--micro 4] [--memory]`` prints one JSON line: ltc_cache's counters,
Dynamo's captured frames, AOTAutograd's traces (counted apart), the losses
of both, the largest gradient difference (before each optimizer step; the
eager copy takes the compiled model's weights at each step, so that the
two are compared at the same point, not after AdamW amplified a rounding),
the first step's time and, with ``--memory``, the bytes a forward leaves
held for its backward (malloc's count of what is allocated, after the
forward against before it) through ltc_cache and in eager, with and
without checkpointing.
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import gc
import json
import sys
import time
import warnings

VOCAB = 128


def build(name: str):
    import transformers

    if name == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB,
                                         n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                         attn_pdrop=0.0, loss_type="ForCausalLM")
        return transformers.GPT2LMHeadModel(config)
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64,
                                      num_attention_heads=4, intermediate_size=128,
                                      vocab_size=VOCAB, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config)


class _MallInfo(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                 "uordblks", "fordblks", "keepcost")]


def allocated() -> int | None:
    """Bytes malloc has handed out and not taken back (glibc's mallinfo2:
    its heap's used blocks and its mmap'd ones); None without it."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo
    except (OSError, AttributeError):
        return None
    info = libc.mallinfo2()
    return int(info.uordblks + info.hblkhd)


def held_by_forward(model, ids) -> int | None:
    """The bytes one forward (and its loss) leaves allocated until its
    backward: activations saved for the backward, the loss, the logits."""
    gc.collect()
    before = allocated()
    loss = model(input_ids=ids, labels=ids).loss
    gc.collect()
    after = allocated()
    loss.backward()
    model.zero_grad(set_to_none=True)
    return None if before is None or after is None else after - before


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", choices=["gpt2", "llama"])
    parser.add_argument("--reentrant", action="store_true")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--memory", action="store_true")
    options = parser.parse_args(argv)

    import torch

    import ltc_cache
    from tools.probes import AOT, count_aot_traces

    count_aot_traces()
    torch.manual_seed(0)
    model = build(options.model)
    model.train()
    eager = copy.deepcopy(model)
    kwargs = {"use_reentrant": options.reentrant}
    result: dict = {"losses": [], "eager_losses": [], "grad_error": 0.0, "grad_scale": 0.0}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for m in (model, eager):
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        compiled = ltc_cache.compile(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        eager_optimizer = torch.optim.AdamW(eager.parameters(), lr=1e-3)
        generator = torch.Generator().manual_seed(1)
        batches = [torch.randint(0, VOCAB, (options.batch, options.seq), generator=generator)
                   for _ in range(options.steps * options.micro)]
        for step in range(options.steps):
            with torch.no_grad():  # compared at the same weights
                for p, q in zip(model.parameters(), eager.parameters(), strict=True):
                    q.copy_(p)
            start = time.perf_counter()
            for index in range(options.micro):
                ids = batches[step * options.micro + index]
                out = compiled(input_ids=ids, labels=ids)
                (out.loss / options.micro).backward()
                result["losses"].append(out.loss.item())
            if step == 0:
                result["first_step_s"] = time.perf_counter() - start
            for index in range(options.micro):
                ids = batches[step * options.micro + index]
                out = eager(input_ids=ids, labels=ids)
                (out.loss / options.micro).backward()
                result["eager_losses"].append(out.loss.item())
            for p, q in zip(model.parameters(), eager.parameters(), strict=True):
                result["grad_error"] = max(result["grad_error"],
                                           (p.grad - q.grad).abs().max().item())
                result["grad_scale"] = max(result["grad_scale"], q.grad.abs().max().item())
            optimizer.step()
            eager_optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            eager_optimizer.zero_grad(set_to_none=True)
        result["stats"] = ltc_cache.stats()
        result["aot"] = AOT["traces"]
        result["frames_ok"] = int(torch._dynamo.utils.counters["frames"]["ok"])
        if options.memory:
            ids = batches[0]
            held = {"ltc_cache": held_by_forward(compiled, ids),
                    "eager": held_by_forward(eager, ids)}
            eager.gradient_checkpointing_disable()
            held["eager_unchecked"] = held_by_forward(eager, ids)
            result["held"] = held
    result["warnings"] = [str(w.message) for w in caught if "ltc_cache" in str(w.message)]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
