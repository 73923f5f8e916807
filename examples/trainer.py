"""Train a tiny transformers model with its own ``Trainer`` (or a hand-written
loop) through ltc_cache.compile.

    LTC_CACHE_DIR=/tmp/ltc python examples/trainer.py [--model gpt2|bert]
        [--compile ltc_cache|torch|inductor|eager]
        [--loop trainer|script|accelerate|lightning]
        [--steps 6] [--reference] [--json]

The model: a 2-layer GPT-2 language model, or a 2-layer BERT classifier
(3 labels), random weights, a synthetic dataset; CPU, no downloads.

- ``--compile ltc_cache`` (the recipe): ``Trainer(model=ltc_cache.compile(model), ...)``;
  ``torch``: ``torch.compile(model, backend="ltc_cache")``; ``inductor``:
  ``TrainingArguments(torch_compile=True)``, Inductor, the way transformers
  documents it; ``eager``: no compiler.
- ``--loop trainer``: ``Trainer.train()``, then ``Trainer.evaluate()``, then
  ``Trainer.save_model()`` (reloaded with ``from_pretrained`` and compared).
  ``--loop script``: a hand-written loop in the style of small-GPT training
  scripts: an evaluation (``eval()``, ``no_grad``) before the first step,
  then AdamW steps. ``--loop accelerate``: ``Accelerator().prepare(model,
  optimizer, dataloader)``, steps, an evaluation, ``save_model``.
  ``--loop lightning``: ``pytorch_lightning.Trainer().fit(ltc_cache.compile(
  lit_module))`` (the LightningModule's forward calls the model), then
  ``validate`` (needs pytorch-lightning).

The first run captures the programs (training and evaluation) and traces
their graphs; the second loads them (no Dynamo capture, no AOTAutograd, no
LTC trace) and repeats the losses bit for bit. ``--reference`` runs the
same in eager PyTorch in this process too, for the losses to compare.
``--json`` prints one JSON line: losses, times (``first_step_s``: the
first training step, loading or compiling included; ``steady_step_s``: the
median step from the third on; ``first_iteration_s`` for the script loop:
evaluation plus first step), and what ran (``ltc_cache.stats()``, Dynamo's
captured frames).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

VOCAB, SEQ, BATCH, LABELS = 96, 16, 4, 3


def build(name: str) -> torch.nn.Module:
    import transformers

    if name == "gpt2":
        config = transformers.GPT2Config(
            n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB, n_positions=SEQ, bos_token_id=0,
            eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        return transformers.GPT2LMHeadModel(config)
    config = transformers.BertConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128,
        vocab_size=VOCAB, max_position_embeddings=SEQ, num_labels=LABELS,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        # Set here, or the classifier sets it on its first call, and the
        # calls after it need a second program (docs/recipes.md, Trainer).
        problem_type="single_label_classification")
    return transformers.BertForSequenceClassification(config)


class Synthetic(torch.utils.data.Dataset):
    """Rows that repeat a random pattern (the LM's loss falls); the
    classifier's label is the pattern's first token modulo LABELS."""

    def __init__(self, model: str, rows: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.empty(rows, SEQ, dtype=torch.long)
        for row in range(rows):
            period = int(torch.randint(2, 6, (1,), generator=generator))
            pattern = torch.randint(0, VOCAB, (period,), generator=generator)
            self.ids[row] = pattern.repeat(SEQ // period + 1)[:SEQ]
        self.labels = self.ids.clone() if model == "gpt2" else self.ids[:, 0] % LABELS

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[index], "attention_mask": torch.ones(SEQ, dtype=torch.long),
                "labels": self.labels[index]}


def compiled(model: torch.nn.Module, how: str) -> torch.nn.Module:
    if how == "ltc_cache":
        import ltc_cache

        return ltc_cache.compile(model)
    if how == "torch":
        return torch.compile(model, backend="ltc_cache")
    return torch.compile(model) if how == "inductor" else model


class _Clock:
    """Step times, from Trainer's callbacks."""

    def __init__(self) -> None:
        self.steps: list[float] = []
        self._start = 0.0

    def callback(self) -> Any:
        import transformers

        clock = self

        class Timing(transformers.TrainerCallback):
            def on_step_begin(self, args, state, control, **kwargs):
                clock._start = time.perf_counter()

            def on_step_end(self, args, state, control, **kwargs):
                clock.steps.append(time.perf_counter() - clock._start)

        return Timing()


def with_trainer(name: str, model: torch.nn.Module, how: str, steps: int,
                 output: Path) -> dict[str, Any]:
    import transformers

    clock = _Clock()
    args = transformers.TrainingArguments(
        output_dir=str(output), max_steps=steps, per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH, learning_rate=1e-3, use_cpu=True, report_to="none",
        logging_steps=1, save_strategy="no", disable_tqdm=True, seed=0,
        dataloader_drop_last=True, torch_compile=how == "inductor")
    trainer = transformers.Trainer(
        model=compiled(model, "eager" if how == "inductor" else how), args=args,
        train_dataset=Synthetic(name, 8 * BATCH, seed=1),
        eval_dataset=Synthetic(name, 2 * BATCH, seed=2), callbacks=[clock.callback()])
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    start = time.perf_counter()
    eval_loss = trainer.evaluate()["eval_loss"]
    eval_s = time.perf_counter() - start
    # Saved as the plain model (save_pretrained), loadable without ltc_cache.
    trainer.save_model(str(output / "saved"))
    loaded = type(model).from_pretrained(str(output / "saved"))
    saved_ok = all(torch.equal(a, b) for a, b in zip(
        loaded.state_dict().values(), model.state_dict().values(), strict=True))
    return {"losses": losses, "eval_loss": eval_loss, "first_step_s": clock.steps[0],
            "steady_step_s": statistics.median(clock.steps[2:] or clock.steps),
            "eval_s": eval_s, "saved_ok": saved_ok,
            "trainer_model": type(trainer.model).__name__}


def with_script(name: str, model: torch.nn.Module, how: str, steps: int) -> dict[str, Any]:
    data = Synthetic(name, steps * BATCH, seed=1)
    held_out = Synthetic(name, BATCH, seed=2)
    net = compiled(model, how)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, times = [], []
    start = time.perf_counter()
    net.eval()  # the evaluation small-GPT scripts run before their first step
    with torch.no_grad():
        eval_loss = net(input_ids=held_out.ids, labels=held_out.labels).loss.item()
    net.train()
    for step in range(steps):
        if step:
            start = time.perf_counter()
        rows = slice(step * BATCH, (step + 1) * BATCH)
        loss = net(input_ids=data.ids[rows], labels=data.labels[rows]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        times.append(time.perf_counter() - start)
    return {"losses": losses, "eval_loss": eval_loss, "first_iteration_s": times[0],
            "steady_step_s": statistics.median(times[2:] or times)}


def with_accelerate(name: str, model: torch.nn.Module, how: str, steps: int,
                    output: Path) -> dict[str, Any]:
    """``Accelerator().prepare(model, optimizer, dataloader)``, steps, an
    evaluation, then ``unwrap_model`` and ``save_model`` as accelerate's
    examples do."""
    from accelerate import Accelerator
    from safetensors.torch import load_file

    accelerator = Accelerator(cpu=True)
    net = compiled(model, how)
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(Synthetic(name, steps * BATCH, seed=1), batch_size=BATCH)
    net, optimizer, loader = accelerator.prepare(net, optimizer, loader)
    losses, times = [], []
    net.train()
    for batch in loader:
        start = time.perf_counter()
        loss = net(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        times.append(time.perf_counter() - start)
    held_out = Synthetic(name, BATCH, seed=2)
    net.eval()
    with torch.no_grad():
        eval_loss = net(input_ids=held_out.ids, labels=held_out.labels).loss.item()
    unwrapped = accelerator.unwrap_model(net, keep_torch_compile=False)
    accelerator.save_model(net, str(output))
    saved = load_file(str(output / "model.safetensors"))
    state = model.state_dict()
    # (Tied weights are saved once.)
    saved_ok = set(saved) <= set(state) and all(torch.equal(saved[k], state[k]) for k in saved)
    return {"losses": losses, "eval_loss": eval_loss, "first_step_s": times[0],
            "steady_step_s": statistics.median(times[2:] or times), "saved_ok": saved_ok,
            "unwrapped_is_model": unwrapped is model,
            "prepared_is_compiled": net is not model and unwrapped is not net}


try:  # for --loop lightning only
    import pytorch_lightning as pl
except ImportError:
    pl = None

if pl is not None:

    class Lit(pl.LightningModule):
        """The transformers model in a LightningModule; its forward is what
        ``ltc_cache.compile`` compiles, the steps stay eager."""

        def __init__(self, net: torch.nn.Module) -> None:
            super().__init__()
            self.net = net
            self.losses: list[float] = []
            self.eval_losses: list[float] = []

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    labels: torch.Tensor) -> torch.Tensor:
            return self.net(input_ids=input_ids, attention_mask=attention_mask,
                            labels=labels).loss

        def training_step(self, batch: dict[str, torch.Tensor], index: int) -> torch.Tensor:
            loss = self(**batch)
            self.losses.append(loss.item())
            return loss

        def validation_step(self, batch: dict[str, torch.Tensor], index: int) -> None:
            self.eval_losses.append(self(**batch).item())

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)


def with_lightning(name: str, model: torch.nn.Module, how: str, steps: int) -> dict[str, Any]:
    """``pytorch_lightning.Trainer().fit(ltc_cache.compile(lit_module))``, then
    ``validate``."""
    lit = Lit(model)
    clock = _Clock()

    class Timing(pl.Callback):
        def on_train_batch_start(self, trainer, module, batch, index):
            clock._start = time.perf_counter()

        def on_train_batch_end(self, trainer, module, outputs, batch, index):
            clock.steps.append(time.perf_counter() - clock._start)

    trainer = pl.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         callbacks=[Timing()])
    train = torch.utils.data.DataLoader(Synthetic(name, steps * BATCH, seed=1), batch_size=BATCH)
    held_out = torch.utils.data.DataLoader(Synthetic(name, BATCH, seed=2), batch_size=BATCH)
    trainer.fit(compiled(lit, how), train)
    trainer.validate(lit, held_out, verbose=False)
    return {"losses": lit.losses, "eval_loss": lit.eval_losses[0],
            "first_step_s": clock.steps[0],
            "steady_step_s": statistics.median(clock.steps[2:] or clock.steps)}


LOOPS = {"trainer": with_trainer, "accelerate": with_accelerate, "lightning": with_lightning,
         "script": with_script}


def run(options: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(0)
    model = build(options.model)
    reference = copy.deepcopy(model) if options.reference else None
    with tempfile.TemporaryDirectory(prefix="ltc-trainer-") as scratch:
        def train(target: torch.nn.Module, how: str, output: str) -> dict[str, Any]:
            loop = LOOPS[options.loop]
            if options.loop in ("trainer", "accelerate"):  # the two that write a run directory
                return loop(options.model, target, how, options.steps, Path(scratch) / output)
            return loop(options.model, target, how, options.steps)

        result = train(model, options.compile, "run")
        if reference is not None:
            eager = train(reference, "eager", "eager")
    if reference is not None:
        result["eager_losses"], result["eager_eval_loss"] = eager["losses"], eager["eval_loss"]
    if options.compile in ("ltc_cache", "torch"):
        import ltc_cache

        result["stats"] = ltc_cache.stats()
    result["frames_captured"] = int(torch._dynamo.utils.counters["frames"]["ok"])
    return result


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("gpt2", "bert"), default="gpt2")
    p.add_argument("--compile", choices=("ltc_cache", "torch", "inductor", "eager"),
                   default="ltc_cache")
    p.add_argument("--loop", choices=("trainer", "script", "accelerate", "lightning"),
                   default="trainer")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--reference", action="store_true", help="the same in eager, for the losses")
    p.add_argument("--json", action="store_true", help="one JSON line")
    return p


def main(argv: list[str] | None = None) -> int:
    options = parser().parse_args(argv)
    result = run(options)
    if options.json:
        print(json.dumps(result))
        return 0
    print(f"{options.model}, {options.loop} loop, compile={options.compile}")
    print("losses:", " ".join(f"{x:.4f}" for x in result["losses"]),
          f"eval loss {result['eval_loss']:.4f}")
    first = result.get("first_step_s", result.get("first_iteration_s"))
    print(f"first step {first:.3f} s, steady step {result['steady_step_s'] * 1e3:.1f} ms")
    if "stats" in result:
        stats = result["stats"]
        print(f"programs loaded {stats.get('program_hits', 0)}, captured "
              f"{stats.get('program_captures', 0)}; LTC traces {stats['traces']}, AOTAutograd "
              f"traces {stats.get('aot_traces', 0)}; Dynamo frames {result['frames_captured']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
