"""The core: a persistent extract_compiled_graph, cold in this process and
warm in child processes."""

from __future__ import annotations

import subprocess
import sys

import msgpack
import pytest
import torch
import torch._lazy.config
from helpers import CHILDREN, child_env, delta, run_child

import ltc_cache
from ltc_cache import CacheConfig, GraphCache
from ltc_cache.entries.entry import decode
from ltc_cache.entries.wire import FORMAT
from ltc_cache.graph.graph_keys import compute_key
from ltc_cache.store import DiskStore
from zoo.corner_models import CASES, ORIGINAL_CASES, build, check_against_eager, random_inputs

ALL_CASES = list(CASES)


def test_every_case_cold_here_then_warm_in_another_process(cache_dir):
    before = ltc_cache.stats()
    for name in ALL_CASES:
        gm, shapes = build(name)
        compiled = ltc_cache.extract_compiled_graph(gm, random_inputs(shapes, seed=1))
        check_against_eager(gm, compiled, shapes)
    assert delta(before) == {"hits": 0, "misses": len(ALL_CASES), "traces": len(ALL_CASES),
                             "stores": len(ALL_CASES), "errors": 0}

    report = run_child(*ALL_CASES)
    assert report["failures"] == {}
    assert report["stats"] == {"hits": len(ALL_CASES), "misses": 0, "traces": 0, "stores": 0,
                               "errors": 0}
    # A hit rebuilds the callable from the entry: no lazy tensor, no sync.
    assert report["syncs"] == 0
    assert report["lazy_tensors_created"] == 0


@pytest.mark.slow  # a child process
def test_a_cold_child_does_trace(cache_dir):
    """The counters the warm test relies on do see a trace."""
    report = run_child("sub", "weighted")
    assert report["failures"] == {}
    assert report["stats"]["traces"] == 2
    assert report["syncs"] == 2
    assert report["lazy_tensors_created"] > 0


def test_forced_fallback_is_refused_and_remembered(cache_dir):
    gm, shapes = build("sub")
    old = torch._lazy.config.get_force_fallback()
    torch._lazy.config.set_force_fallback("aten::sub")
    before = ltc_cache.stats()
    try:
        for _ in range(2):
            with pytest.raises(RuntimeError, match=r"because of fallback: aten::sub\.Tensor=1"):
                ltc_cache.extract_compiled_graph(gm, random_inputs(shapes, seed=1))
    finally:
        torch._lazy.config.set_force_fallback(old)
    # Traced once; the refusal is stored as a negative entry, not a graph.
    assert delta(before)["traces"] == 1
    store = DiskStore(cache_dir)
    entry_keys = [k for k in list(store.keys()) if len(k) == 64]  # not internal records
    entries = [decode(store.get(k)) for k in entry_keys]
    assert [e.kind for e in entries] == ["negative"]


@pytest.mark.slow  # child processes
def test_original_cases_refuse_fallback_in_a_child_too(cache_dir):
    report = run_child(*ORIGINAL_CASES)  # cold child fills the cache
    assert report["failures"] == {}
    code = (
        "import torch, ltc_cache; from zoo.corner_models import build, random_inputs;"
        "import torch._lazy.config; torch._lazy.config.set_force_fallback('aten::sub');"
        "gm, shapes = build('sub');"
        "ltc_cache.extract_compiled_graph(gm, random_inputs(shapes, 1))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, env=child_env())
    # The forced fallback is part of the key, so the stored entry is not used.
    assert proc.returncode != 0
    assert "because of fallback: aten::sub" in proc.stderr


def test_outputs_alias_as_in_eager(cache_dir):
    gm, shapes = build("returns_input")
    compiled = ltc_cache.extract_compiled_graph(gm, random_inputs(shapes, 1))
    a, b = random_inputs(shapes, 2)
    out = compiled(a, b)
    assert out[0] is a and out[1] is b

    gm, shapes = build("return_dup_tensor")
    compiled = ltc_cache.extract_compiled_graph(gm, random_inputs(shapes, 1))
    out = compiled(*random_inputs(shapes, 2))
    assert out[1] is out[3]


def test_weights_are_bound_live(cache_dir):
    gm, shapes = build("weighted")
    gm.eval()
    compiled = ltc_cache.extract_compiled_graph(gm, random_inputs(shapes, 1))
    new_weights = build("weighted", seed=42)[0].state_dict()
    gm.load_state_dict(new_weights)
    x = random_inputs(shapes, 3)[0]
    torch.testing.assert_close(compiled(x)[0], gm(x))


@pytest.mark.slow  # two child processes
def test_a_process_whose_model_has_other_weights_gets_its_own_results(cache_dir):
    gm, shapes = build("weighted")
    gm.eval()
    ltc_cache.extract_compiled_graph(gm, random_inputs(shapes, 1))
    report = run_child("weighted", "--seed", "7")
    assert report["failures"] == {}
    assert report["stats"]["traces"] == 1  # train mode: another graph than eval
    report = run_child("weighted", "--seed", "8")
    assert report["failures"] == {} and report["stats"]["hits"] == 1


def test_disabled_cache_reads_and_writes_nothing(cache_dir, monkeypatch):
    monkeypatch.setenv("LTC_CACHE_DISABLE", "1")
    gm, shapes = build("addcmul")
    before = ltc_cache.stats()
    check_against_eager(gm, ltc_cache.extract_compiled_graph(gm, random_inputs(shapes, 1)),
                        shapes)
    assert not cache_dir.exists()
    assert delta(before)["traces"] == 1 and delta(before)["stores"] == 0


def test_directory_is_private(cache_dir):
    gm, shapes = build("const_scale")
    ltc_cache.extract_compiled_graph(gm, random_inputs(shapes, 1))
    assert cache_dir.stat().st_mode & 0o777 == 0o700


def test_unusable_directory_warns_and_runs(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    cache = GraphCache(CacheConfig(directory=blocker / "ltc"))
    gm, shapes = build("return_multi")
    before = ltc_cache.stats()
    with pytest.warns(RuntimeWarning, match="cannot use cache directory"):
        compiled = cache.extract_compiled_graph(gm, random_inputs(shapes, 1))
    check_against_eager(gm, compiled, shapes)
    assert delta(before)["errors"] == 1


def _key_of(name: str) -> tuple[str, object, list]:
    gm, shapes = build(name)
    return compute_key(gm, random_inputs(shapes, 1)).digest, gm, shapes


def test_corrupt_entry_warns_retraces_and_is_replaced(cache_dir):
    key, gm, shapes = _key_of("inplace_update")
    store = DiskStore(cache_dir)
    store.put(key, b"\x93garbage that is not an entry")
    cache = GraphCache(CacheConfig(directory=cache_dir))
    before = ltc_cache.stats()
    with pytest.warns(RuntimeWarning, match="not msgpack|not an ltc_cache entry"):
        compiled = cache.extract_compiled_graph(gm, random_inputs(shapes, 1))
    check_against_eager(gm, compiled, shapes)
    assert delta(before)["traces"] == 1 and delta(before)["errors"] == 1
    assert decode(store.get(key), expected_key=key).key == key


def test_entry_of_another_schema_is_a_miss(cache_dir):
    key, gm, shapes = _key_of("sub")
    store = DiskStore(cache_dir)
    store.put(key, msgpack.packb({"format": FORMAT, "schema": 999, "sha256": b"", "body": b""}))
    cache = GraphCache(CacheConfig(directory=cache_dir))
    before = ltc_cache.stats()
    with pytest.warns(RuntimeWarning, match="schema 999"):
        compiled = cache.extract_compiled_graph(gm, random_inputs(shapes, 1))
    check_against_eager(gm, compiled, shapes)
    assert delta(before)["traces"] == 1
    assert decode(store.get(key), expected_key=key).key == key


@pytest.mark.slow  # four processes
def test_four_processes_on_one_cold_key_trace_once(cache_dir):
    cmd = [sys.executable, str(CHILDREN / "extract.py"), "weighted", "--wait"]
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=child_env())
             for _ in range(4)]
    outputs = [p.communicate(input="", timeout=300) for p in procs]  # released together
    import json

    reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    assert all(r["failures"] == {} for r in reports), reports
    assert sum(r["stats"]["traces"] for r in reports) == 1
    assert sum(r["stats"]["hits"] for r in reports) == 3


def test_a_trace_leaves_the_models_own_weights_in_place(monkeypatch):
    """The trace swaps lazy tensors in for the weights of shadows of the
    model's modules: another thread reading or running the model meanwhile
    (a server's other workers) still finds its CPU weights. Before, a
    thread that took the module's tensors during a trace bound lazy ones,
    and every call of its replay failed ("Input tensor is not a lazy tensor")."""
    import contextlib

    from ltc_cache.graph import extract

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    gm = torch.fx.symbolic_trace(model)
    seen: list[set[str]] = []
    swap = extract.reparametrized

    @contextlib.contextmanager
    def watched(module, state):
        with swap(module, state):
            seen.append({t.device.type for t in [*gm.parameters(), *model.parameters()]})
            yield

    monkeypatch.setattr(extract, "reparametrized", watched)
    x = torch.randn(3, 4)
    extraction = extract.trace(gm, [x])
    assert seen == [{"cpu"}]
    assert extraction.ir
