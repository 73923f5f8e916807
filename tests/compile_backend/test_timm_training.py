"""timm's models (the vision half of PyTorch's benchmark suites, built small
by zoo/timm_models.py) train inside LTC: each model's first training call
through ``ltc_cache.compile``, cold then warm in child processes
(tests/children/suite.py, tools/bench/suite_child.py's counts), is as eager's, the
warm one captures and traces nothing, and the share of its aten ops in LTC
and its count of regions are no worse than recorded here. A change to
partitioning that moves a model's ops out of LTC, or cuts it into more
regions, fails here by model.
"""

from __future__ import annotations

import pytest
from helpers import suite_cold_then_warm

from zoo.timm_models import TIMM, import_timm

# Per model: the least share of its training step's aten ops in LTC (percent)
# and the most LTC regions (forward and backward) measured on this branch.
# What stays out is named in docs/models.md ("timm").
FLOORS = {
    "resnet18": (99, 2),
    "efficientnet_b0": (99, 2),
    "convnext_atto": (99, 2),
    "regnetx_002": (99, 2),
    "mixer_b16_224": (93, 2),
    "densenet121": (99, 2),
    "ghostnet_100": (99, 2),
    "levit_128s": (97, 2),
    "swin_tiny_patch4_window7_224": (94, 2),
    "vit_tiny_patch16_224": (91, 10),
    "deit_tiny_distilled_patch16_224": (91, 10),
}


def _timm_or_skip() -> None:
    try:
        import_timm()
    except ImportError as exc:  # the test extra is not installed
        pytest.skip(f"timm does not import: {exc}")


@pytest.fixture(scope="session")
def starts(tmp_path_factory) -> dict:
    """Once for the whole run: a cold process over a new cache directory,
    then a warm one, each training every timm model once."""
    _timm_or_skip()
    return suite_cold_then_warm(tmp_path_factory, "test_timm_training", list(FLOORS),
                                cold_timeout=1500)


def test_every_timm_model_has_a_floor():
    assert set(FLOORS) == set(TIMM)


@pytest.mark.slow
@pytest.mark.parametrize("model", list(FLOORS))
def test_timm_training_stays_in_ltc(model, starts):
    cold, warm = starts["cold"][model], starts["warm"][model]
    for run in (cold, warm):
        assert run["error"] <= 1e-4 and not run["missing_grads"], run
        assert max(run["buffer_error"], 0.0) <= 1e-5, run
        assert not run["warnings"] and run["stats"]["errors"] == 0, run
    least_share, most_regions = FLOORS[model]
    stats = warm["stats"]
    share = 100 * stats["ltc_ops"] / stats["aten_ops"]
    assert share >= least_share, (model, share, cold["regions"])
    assert cold["regions"] <= most_regions, (model, share, cold["regions"])
    # Warm: nothing captured, traced by AOTAutograd or traced by LTC.
    assert (stats["traces"], warm["aot"], warm["frames"]) == (0, 0, 0), warm
    assert stats.get("program_captures", 0) == 0 and stats["program_hits"] == 1, stats
