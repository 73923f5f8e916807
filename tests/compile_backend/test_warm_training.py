"""A warm start runs no AOTAutograd trace: training (forward and backward)
and partitioned inference, cold then warm in real subprocesses that count
AOTAutograd's graph captures themselves (tools/probes.py wraps
``aot_dispatch_autograd_graph`` and ``aot_dispatch_base_graph``). The
training models share a cold and a warm process (one model after the
other, each counted on its own).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import child_env, json_child, once_per_run, relative_error

# (GPT-2 without dropout: its graphs are gpt2_dropout's but for the RNG.)
TRAINED = ["llama_gqa", "gpt2_dropout", "token_mlp"]


def child(scenario: str, model: str, *args: str) -> dict:
    """One process running ``scenario`` for ``model``: its report."""
    return json_child("backend_scenarios.py", scenario, model, *args, timeout=900)[model]


def cli_stats(env: dict[str, str]) -> dict:
    script = Path(sys.executable).with_name("ltc-cache")  # the installed console script
    proc = subprocess.run([str(script), "stats", "--json"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> dict:
    """Once for the whole run: the models of TRAINED trained in a cold
    process, then in a warm one, over a new cache directory; the store's
    counters after both (``ltc-cache stats``)."""

    def cold_then_warm(directory: Path) -> dict:
        env = {k: v for k, v in child_env().items() if not k.startswith("LTC_CACHE_")}
        env.update(LTC_CACHE_DIR=str(directory / "ltc"), LTC_CACHE_FUSE="off")
        cold = json_child("backend_scenarios.py", "train", *TRAINED, env=env, timeout=900)
        warm = json_child("backend_scenarios.py", "train", *TRAINED, env=env, timeout=900)
        return {"cold": cold, "warm": warm, "counters": cli_stats(env)["counters"]}

    return once_per_run(tmp_path_factory, "test_warm_training", cold_then_warm)[1]


@pytest.mark.slow
@pytest.mark.parametrize("model", TRAINED)
def test_training_warm_start_runs_no_aotautograd(model, trained):
    """AdamW steps, an output changed in place, an eval() pass, a frozen
    parameter, load_state_dict (token_mlp's logits view an intermediate):
    three Dynamo graphs (training, inference, training with one input that
    needs no gradient), each through AOTAutograd in the cold process and
    from its plan in the warm one."""
    cold, warm = trained["cold"][model], trained["warm"][model]

    # The training graph twice (the frozen parameter), and the inference
    # graph where it needs partitioning (token_mlp's lowers whole).
    assert cold["aot"] >= (2 if model == "token_mlp" else 3), cold
    assert warm["aot"] == 0, warm
    assert warm["stats"].get("aot_traces", 0) == 0
    assert (warm["stats"]["traces"], warm["stats"]["misses"]) == (0, 0), warm["stats"]
    assert warm["stats"]["plan_hits"] == cold["stats"]["aot_traces"] == cold["aot"]
    for run in (cold, warm):
        # Losses, the eval() loss, and whether the frozen parameter got no
        # gradient (1.0), against eager in the same process; dropout (0.1 in
        # gpt2_dropout) draws the same masks as eager.
        assert relative_error(run["got"], run["eager"]) <= 1e-5, run
        assert not run["warnings"] and run["stats"]["errors"] == 0, run
    assert warm["got"] == cold["got"]  # bit for bit


@pytest.mark.slow
def test_the_store_counts_the_traces_and_plan_hits_of_every_process(trained):
    """Across processes (the cold one traced, the warm one used the plans):
    ``ltc-cache stats`` counted both."""
    aot = sum(trained["cold"][model]["aot"] for model in TRAINED)
    assert aot > 0
    assert trained["counters"]["aot_traces"] == aot
    assert trained["counters"]["plan_hits"] == aot


@pytest.mark.slow
def test_partitioned_inference_makes_the_same_regions_cold_and_warm(cache_dir):
    """Grouped-query attention (fewer key-value heads) needs partitioning.
    The cold process partitions AOTAutograd's graph as its plan rebuilds it,
    so the first warm process finds every region it makes: no trace."""
    cold = child("infer", "llama_gqa")
    warm = child("infer", "llama_gqa")
    assert cold["aot"] == 1 and cold["stats"]["traces"] >= 2, cold
    assert warm["aot"] == 0, warm
    assert (warm["stats"]["traces"], warm["stats"]["misses"]) == (0, 0), warm["stats"]
    assert warm["stats"]["hits"] == cold["stats"]["stores"]
    assert warm["digest"] == cold["digest"]
    for run in (cold, warm):
        assert run["max_error"] <= 1e-5 and not run["warnings"], run


def by_length(run: dict, lengths: str) -> dict[int, float]:
    return dict(zip((int(n) for n in lengths.split(",")), run["got"], strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gpt2"])
def test_dynamic_true_runs_in_ltc_and_warms_in_any_order(model, cache_dir):
    """dynamic=True: Dynamo passes the models' float attributes as 0-dim
    tensors read with .item(), which AOTAutograd cannot trace; they are
    folded per shape, so the graph runs in LTC regions, not eagerly."""
    cold = child("dynamic", model, "--lengths", "16,24")
    warm = child("dynamic", model, "--lengths", "24,16")
    for run in (cold, warm):
        assert not run["warnings"] and run["stats"]["errors"] == 0, run
        assert run["max_error"] <= 1e-4, run
        assert run["stats"]["ltc_ops"] >= 0.9 * run["stats"]["aten_ops"] > 0, run["stats"]
    assert cold["aot"] == 2  # one AOTAutograd trace per shape
    assert warm["aot"] == 0, warm
    assert (warm["stats"]["traces"], warm["stats"]["misses"]) == (0, 0), warm["stats"]
    assert by_length(warm, "24,16") == by_length(cold, "16,24")


@pytest.mark.slow
def test_automatic_dynamic_shapes_compile_each_shape_once(cache_dir):
    """Lengths 16, 24, 16, 12: Dynamo compiles a static graph for 16, then a
    symbolic one; 16 under the symbolic graph is the static graph's entries
    (one AOTAutograd trace per distinct shape). A warm process meeting the
    shapes in another order (static first for 12 this time) traces nothing."""
    cold = child("automatic", "gpt2", "--lengths", "16,24,16,12")
    warm = child("automatic", "gpt2", "--lengths", "12,24,16")
    assert cold["aot"] == 3, cold
    assert cold["stats"]["plan_hits"] == 1  # 16 again, under the symbolic graph
    assert warm["aot"] == 0, warm
    assert (warm["stats"]["traces"], warm["stats"]["misses"]) == (0, 0), warm["stats"]
    for run in (cold, warm):
        assert not run["warnings"] and run["max_error"] <= 1e-4, run
    assert by_length(warm, "12,24,16") == by_length(cold, "16,24,16,12")
