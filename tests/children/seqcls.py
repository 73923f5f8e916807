"""A child process that trains transformers' ``GPT2ForSequenceClassification``
through ``ltc_cache.compile`` and the same steps eagerly on a copy.

``python tests/children/seqcls.py [--steps 3]`` prints one JSON line: the
losses of both, the largest difference between their weights after the
steps, ltc_cache's counters, Dynamo's frames, AOTAutograd's traces, the
seconds of the first compiled step and what ``ltc_cache.precompile`` logged.

The classifier takes the logits of each sequence's last non-pad token
(``argmax`` over the positions, then an index), and its first forward with
``labels`` sets ``config.problem_type``, which the forward reads: the
layout's first call and the calls after it are two programs.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time

VOCAB, BATCH, SEQ = 128, 2, 8


def model():
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64, bos_token_id=0,
        eos_token_id=0, pad_token_id=0, num_labels=2, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, summary_first_dropout=0.0)
    net = transformers.GPT2ForSequenceClassification(config)
    net.train()
    return net


def batch():
    import torch

    ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    ids[0, SEQ - 3:] = 0  # right padding: the first sequence's last token is not its last
    return ids, torch.tensor([0, 1])


def steps(net, count: int) -> tuple[list[float], float]:
    import torch

    ids, labels = batch()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    losses, first = [], 0.0
    start = time.perf_counter()
    for step in range(count):
        optimizer.zero_grad()
        loss = net(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        if step == 0:
            first = time.perf_counter() - start
    return losses, first


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    options = parser.parse_args(argv)

    import torch

    import ltc_cache
    from tools.probes import AOT, count_aot_traces, program_logs

    torch.set_num_threads(1)
    logs = program_logs()
    count_aot_traces()
    net = model()
    eager = copy.deepcopy(net)
    losses, first = steps(ltc_cache.compile(net), options.steps)
    stats = ltc_cache.stats()
    frames = int(torch._dynamo.utils.counters["frames"]["ok"])
    aot = AOT["traces"]
    eager_losses, _ = steps(eager, options.steps)
    weights_error = max(float((p - q).abs().max())
                        for p, q in zip(net.parameters(), eager.parameters(), strict=True))
    print(json.dumps({"losses": losses, "eager": eager_losses, "weights_error": weights_error,
                      "stats": stats, "frames_ok": frames, "aot_traces": aot,
                      "first_step_s": first, "logs": logs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
