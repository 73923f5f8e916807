"""Real models end to end through ``torch.compile(backend="ltc_cache")``.

The models run in two real subprocesses over one cache directory, one model
after the other in each (its counters reset before it): the first traces
(cold), the second must hit without tracing or probing (warm). Both compare
against eager in their own process. GPT-2, BERT, Llama, T5 come from
``transformers`` with tiny configs and random weights (no downloads).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import CHILDREN, TESTS, child_env, once_per_run, relative_error

# End to end: real models compiled in fresh processes (`pytest -m "not slow"` skips them).
pytestmark = pytest.mark.slow

# Models that also train for a few steps (forward and backward graphs).
TRAINED = {"gpt2", "cnn"}
STEPS = 5
# (Llama trains and infers warm in test_warm_training.py and test_generate.py.)
MODELS = ["gpt2", "bert", "t5", "transformer_encoder", "cnn"]


def run_models(env: dict[str, str]) -> dict:
    """One process running every model of MODELS (those of TRAINED trained);
    model -> its report."""
    args = [sys.executable, str(CHILDREN / "backend_models.py"), *MODELS,
            "--train", str(STEPS), "--trained", ",".join(TRAINED)]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> dict:
    """Once for the whole run: the cold process, then the warm one, over a
    new cache directory."""

    def cold_then_warm(directory: Path) -> dict:
        env = {k: v for k, v in child_env().items() if not k.startswith("LTC_CACHE_")}
        env.update(LTC_CACHE_DIR=str(directory / "ltc"), LTC_CACHE_FUSE="off")
        cold = run_models(env)
        return {"cold": cold, "warm": run_models(env)}

    return once_per_run(tmp_path_factory, "test_models", cold_then_warm)[1]


@pytest.mark.parametrize("model", MODELS)
def test_model_cold_then_warm(model, runs, record_property):
    steps = STEPS if model in TRAINED else 0
    cold, warm = runs["cold"][model], runs["warm"][model]

    for run in (cold, warm):
        assert run["inference_max_error"] <= 1e-4, run
    assert cold["stats"]["traces"] > 0
    # The second process loads everything: no lazy trace, no op probe.
    assert warm["stats"]["traces"] == 0, warm["stats"]
    assert warm["stats"]["misses"] == 0, warm["stats"]
    assert warm["stats"]["hits"] > 0
    assert warm["probes"] == 0
    for run in (cold, warm):
        assert run["stats"]["errors"] == 0, run["warnings"]
        assert not run["warnings"], run["warnings"]

    inference = warm["inference_stats"]
    # Warm inference runs no AOTAutograd: the graph lowers whole, or its
    # partitioning plan was stored by the cold process.
    assert inference.get("aot_graphs", 0) == 0, inference
    assert inference.get("plan_hits", 0) == inference.get("negative_hits", 0), inference
    share = inference["ltc_ops"] / inference["aten_ops"]
    record_property("ltc_op_share_inference", round(share, 3))
    # Every model here lowers whole, or but for a few ops (partitioning).
    assert share >= 0.9, inference

    if steps:
        for run in (cold, warm):
            assert relative_error(run["losses"], run["eager_losses"]) <= 1e-5, run
        assert warm["losses"] == cold["losses"]
        total = warm["stats"]
        record_property("ltc_op_share_all", round(total["ltc_ops"] / total["aten_ops"], 3))
        assert total["ltc_ops"] / total["aten_ops"] >= 0.9, total


def test_train_example_is_warm_the_second_time(cache_dir):
    """examples/train.py, shortened: the second run traces nothing and
    repeats the first run's losses bit for bit, within 1e-4 of eager."""
    example = TESTS.parent / "examples" / "train.py"
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, str(example), "--steps", "20", "--json"],
                              capture_output=True, text=True, env=child_env(), timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    assert cold["traces"] > 0
    assert (warm["traces"], warm["misses"]) == (0, 0) and warm["hits"] > 0
    # The program loads and its training plan runs: no capture, no AOTAutograd.
    assert cold["aot_traces"] > 0
    assert (warm["program_hits"], warm["frames_captured"], warm["aot_traces"]) == (1, 0, 0), warm
    for run in runs:
        assert run["max_relative_diff_vs_eager"] <= 1e-4, run
        assert run["ltc_op_share"] >= 0.9, run
    differ = [(step, c, w) for step, (c, w) in enumerate(zip(cold["losses"], warm["losses"],
                                                            strict=True)) if c != w]
    assert not differ, f"steps (step, cold, warm) whose losses differ: {differ[:5]}"
    assert warm["loss_digest"] == cold["loss_digest"]
    assert warm["last_loss"] < warm["first_loss"]
