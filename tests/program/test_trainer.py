"""The training loops people already use, through ltc_cache.compile, cold
then warm in fresh processes: transformers' ``Trainer`` (train, evaluate,
save), accelerate's ``Accelerator.prepare``, Lightning's ``Trainer.fit``
and a hand-written loop (an evaluation before the first step). The
warm process captures no Dynamo frame, runs no AOTAutograd trace (counted
by the child itself) and no LTC trace, and repeats the cold losses bit for
bit, which are eager's (to 1e-5).
"""

from __future__ import annotations

import pytest
from helpers import json_child, relative_error

pytest.importorskip("transformers")
pytest.importorskip("accelerate")


def child(*args: str) -> dict:
    return json_child("trainer.py", *args, timeout=900)


def assert_warm(cold: dict, warm: dict, programs: int) -> None:
    assert cold["stats"]["program_captures"] == programs, cold["stats"]
    assert cold["stats"].get("program_fallbacks", 0) == 0, cold["stats"]  # captured whole
    assert cold["aot"] >= 1 and cold["stats"]["traces"] > 0, cold
    stats = warm["stats"]
    assert warm["frames_captured"] == 0, warm
    assert warm["aot"] == 0 and stats.get("aot_traces", 0) == 0, warm
    assert (stats["traces"], stats["misses"], stats.get("program_captures", 0)) == (0, 0, 0), stats
    assert stats["program_hits"] == programs and stats.get("program_fallbacks", 0) == 0, stats
    for run in (cold, warm):
        # As eager in the same process (bit for bit for GPT-2 here; BERT's
        # differ in the last bit with one intra-op thread).
        assert relative_error([*run["losses"], run["eval_loss"]],
                              [*run["eager_losses"], run["eager_eval_loss"]]) <= 1e-5, run
        assert not run["warnings"] and run["stats"]["errors"] == 0, run
    assert warm["losses"] == cold["losses"]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gpt2", "bert"])
def test_trainer_cold_then_warm(model, cache_dir):
    """Trainer(model=ltc_cache.compile(model)): 6 steps, evaluate(),
    save_model(); two programs (training, and evaluation under no_grad)."""
    args = ("--model", model, "--loop", "trainer", "--steps", "6", "--reference")
    cold = child(*args)
    warm = child(*args)
    assert_warm(cold, warm, programs=2)
    for run in (cold, warm):
        # Trainer kept the dataset's columns and labels, and saved the plain
        # model (save_pretrained), which reloads with the trained weights.
        assert run["trainer_model"] == {"gpt2": "GPT2LMHeadModel",
                                        "bert": "BertForSequenceClassification"}[model]
        assert run["saved_ok"], run


@pytest.mark.slow
def test_hand_written_loop_cold_then_warm(cache_dir):
    """An evaluation (eval(), no_grad) before the first step, as small-GPT
    training scripts do, then AdamW steps."""
    args = ("--model", "gpt2", "--loop", "script", "--steps", "4", "--reference")
    assert_warm(child(*args), child(*args), programs=2)


@pytest.mark.slow
def test_accelerate_prepare_cold_then_warm(cache_dir):
    """Accelerator().prepare(ltc_cache.compile(model), optimizer, dataloader):
    steps, an evaluation, unwrap_model and save_model."""
    args = ("--model", "gpt2", "--loop", "accelerate", "--steps", "4", "--reference")
    cold, warm = child(*args), child(*args)
    assert_warm(cold, warm, programs=2)
    for run in (cold, warm):
        assert run["prepared_is_compiled"] and run["unwrapped_is_model"], run
        assert run["saved_ok"], run


@pytest.mark.slow
def test_lightning_fit_cold_then_warm(cache_dir):
    """pytorch_lightning.Trainer().fit(ltc_cache.compile(lit_module)), then
    validate: Lightning unwraps the compiled module and wraps its forward
    with the stand-in's dynamo_ctx; training and validation programs load."""
    pytest.importorskip("pytorch_lightning")
    args = ("--model", "gpt2", "--loop", "lightning", "--steps", "4", "--reference")
    assert_warm(child(*args), child(*args), programs=2)
