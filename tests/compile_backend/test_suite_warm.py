"""The first warm process of a training start captures nothing, runs no
AOTAutograd and traces nothing, for one model of each family of PyTorch's
benchmark suites (built by zoo/suite_models.py from tiny configs), cold
then warm in child processes (tools/bench/suite_child.py's child, one model after
the other in each process, counted on its own: tests/children/suite.py), each
checked against eager in its own process: loss and every gradient within
1e-4 of the largest gradient. The whole suite is the benchmark's
(BENCHMARKS.md), not the test run's.
"""

from __future__ import annotations

import pytest
from helpers import suite_cold_then_warm

# Encoder (at hidden 128: saved views, docs/torch/aot-autograd.md#saved-views-are-detached),
# decoder, encoder-decoder, vision transformer, CNN with BatchNorm (its running statistics as
# eager's, in few regions).
FAMILIES = ["BertForMaskedLM-h128", "DistillGPT2", "T5Small", "ViT", "ResNet"]


@pytest.fixture(scope="session")
def starts(tmp_path_factory) -> dict:
    """Once for the whole run: a cold process over a new cache directory,
    then a warm one, each starting every model of FAMILIES."""
    return suite_cold_then_warm(tmp_path_factory, "test_suite_warm", FAMILIES)


@pytest.mark.slow
@pytest.mark.parametrize("model", FAMILIES)
def test_first_warm_training_start_captures_and_traces_nothing(model, starts):
    cold, warm = starts["cold"][model], starts["warm"][model]
    for run in (cold, warm):
        assert run["error"] <= 1e-4 and not run["missing_grads"], run
        assert not run["warnings"] and run["stats"]["errors"] == 0, run
    if model == "ResNet":  # BatchNorm: running statistics updated in the graph, in LTC
        assert cold["regions"] <= 5, cold
        assert max(cold["buffer_error"], warm["buffer_error"]) <= 1e-5, (cold, warm)
    assert cold["stats"]["traces"] > 0 and cold["stats"]["program_captures"] == 1, cold
    stats = warm["stats"]
    assert warm["misses"] == [], warm["misses"]  # the same keys cold and warm
    assert (stats["traces"], stats["misses"]) == (0, 0), stats
    assert warm["aot"] == 0 and stats.get("aot_traces", 0) == 0, warm
    assert warm["frames"] == 0 and stats.get("program_captures", 0) == 0, warm
    assert stats.get("dynamo_graphs", 0) == 0, stats  # the loaded program's is not Dynamo's
    assert stats.get("program_fallbacks", 0) == 0 and stats["program_hits"] == 1, stats
