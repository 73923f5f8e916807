"""One count, two views: what this process counted (``ltc_cache.stats()``)
and what the directory's ledger counted (``ltc-cache stats``) agree after
each error path, and plan misses are counted in both."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from helpers import ledger_counts

import ltc_cache
from ltc_cache import CacheConfig, GraphCache, LtcBackend
from ltc_cache.cli import main
from ltc_cache.diagnostics import LEDGER_EVENTS
from ltc_cache.graph.graph_keys import compute_key
from ltc_cache.graph.replay import CompiledGraph
from ltc_cache.store import DiskStore
from zoo.corner_models import build, check_against_eager, random_inputs


def assert_agree(directory, *, errors: int) -> None:
    """Every count the ledger keeps is this process's (each test starts with
    fresh process counters and a new directory)."""
    process, ledger = ltc_cache.stats(), ledger_counts(directory)
    assert process["errors"] == errors
    assert {name: ledger.get(name, 0) for name in LEDGER_EVENTS} == \
        {name: process.get(name, 0) for name in LEDGER_EVENTS}


def extract(cache: GraphCache, case: str = "weighted") -> str:
    gm, shapes = build(case)
    example = random_inputs(shapes, seed=1)
    check_against_eager(gm, cache.extract_compiled_graph(gm, example), shapes)
    return compute_key(gm, example).digest


def test_a_corrupt_entry(tmp_path):
    config = CacheConfig(directory=tmp_path / "ltc")
    key = extract(GraphCache(config))
    GraphCache(config).store.put(key, b"not an entry")
    with pytest.warns(RuntimeWarning, match="traced again"):
        extract(GraphCache(config))
    assert_agree(config.directory, errors=1)


def test_a_remote_setting_that_cannot_be_used(tmp_path):
    config = CacheConfig(directory=tmp_path / "ltc", remote="http://127.0.0.1:1/")
    cache = GraphCache(config)
    with pytest.warns(RuntimeWarning, match="local cache only"):
        extract(cache)
    assert isinstance(cache.store, DiskStore)
    assert_agree(config.directory, errors=1)


def test_a_damaged_index_replaced_on_opening(tmp_path):
    directory = tmp_path / "ltc"
    DiskStore(directory).close()
    (directory / "entries" / "cache.db").write_bytes(b"not a database" * 100)
    with pytest.warns(RuntimeWarning, match="damaged"):
        extract(GraphCache(CacheConfig(directory=directory)))
    assert_agree(directory, errors=1)


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def compile_partitioned(directory, model: torch.nn.Module, x: torch.Tensor) -> None:
    """Compile and run ``model`` as a new process would, through AOTAutograd
    and a plan (``whole_graph=False``)."""
    torch._dynamo.reset()
    backend = LtcBackend(GraphCache(CacheConfig(directory=directory)), whole_graph=False)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend=backend)(x), model(x),
                                   atol=1e-6, rtol=1e-6)


@pytest.mark.usefixtures("dynamo_reset")
def test_plan_misses_and_hits_in_both_and_in_ltc_cache_stats(tmp_path, capsys):
    directory = tmp_path / "ltc"
    model, x = MLP().eval(), torch.randn(8, 16)
    compile_partitioned(directory, model, x)
    cold = ltc_cache.stats()
    assert (cold["plan_misses"], cold.get("plan_hits", 0), cold["aot_traces"]) == (1, 0, 1)
    compile_partitioned(directory, model, x)
    warm = ltc_cache.stats()
    assert (warm["plan_misses"], warm["plan_hits"], warm["aot_traces"]) == (1, 1, 1)
    assert_agree(directory, errors=0)

    assert main(["--dir", str(directory), "stats"]) == 0
    shown = capsys.readouterr().out
    for label in ("Plan misses", "Plan hits", "AOT traces"):
        assert re.search(rf"^{label} +1$", shown, re.MULTILINE), shown


@pytest.mark.usefixtures("dynamo_reset")
def test_a_compiler_that_fails(tmp_path, monkeypatch):
    import ltc_cache.compile_backend.partition

    def broken(*args, **kwargs):
        raise ValueError("injected partitioning failure")

    monkeypatch.setattr(ltc_cache.compile_backend.partition, "partition", broken)
    with pytest.warns(RuntimeWarning, match="injected partitioning failure"):
        compile_partitioned(tmp_path / "ltc", MLP().eval(), torch.randn(8, 16))
    assert_agree(tmp_path / "ltc", errors=1)


@pytest.mark.usefixtures("dynamo_reset")
def test_a_stored_graph_that_does_not_run(tmp_path, monkeypatch):
    """A graph whose first replay fails runs eagerly: one error, in both."""
    directory = tmp_path / "ltc"
    model, x = MLP().eval(), torch.randn(8, 16)

    def fails(self, *args):
        raise RuntimeError("injected replay failure")

    monkeypatch.setattr(CompiledGraph, "__call__", fails)
    torch._dynamo.reset()
    backend = LtcBackend(GraphCache(CacheConfig(directory=directory)))
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(torch.compile(model, backend=backend)(x), model(x))
    assert any("does not run" in str(w.message) for w in caught)
    assert_agree(directory, errors=1)
