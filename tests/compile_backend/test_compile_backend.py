"""torch.compile(backend="ltc_cache"): inference, training, partitioning,
the op-support record, negative entries and miss explanations.

Small modules in this process; the transformer models, in real subprocesses,
are in test_models.py.
"""

from __future__ import annotations

import copy
import logging

import msgpack
import pytest
import torch
from helpers import delta

import ltc_cache
from ltc_cache import CacheConfig, GraphCache, LtcBackend
from ltc_cache.compile_backend.support import OpSupport, support_record_key
from ltc_cache.entries.entry import decode

torch.manual_seed(0)


pytestmark = pytest.mark.usefixtures("dynamo_reset")


class MLP(torch.nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(width, width)
        self.fc2 = torch.nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class WithSign(MLP):
    """``aten.sign`` has no LTC lowering and no decomposition here: it must
    run eagerly between two LTC regions."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x))
        return self.fc2(torch.sign(h) * h.exp() + h)


def fresh_backend() -> LtcBackend:
    """A backend over a new GraphCache of the environment's directory: no
    in-process memo of entries or op support, as in a new process."""
    return LtcBackend(GraphCache(CacheConfig.from_env()))


def entries(directory) -> dict[str, ltc_cache.entries.entry.Entry]:
    store = GraphCache(CacheConfig.from_env()).store
    out = {}
    keys = list(store.keys())  # entries and internal records
    for key in keys:
        if len(key) == 64:
            out[key] = decode(store.get(key), expected_key=key)
    return out


def train(model, x, steps: int) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = (model(x) ** 2).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def eager_and_compiled(reference, x, steps: int) -> tuple[list[float], list[float]]:
    """The losses of ``steps`` training steps of a copy of ``reference``,
    eagerly and compiled by the backend."""
    want = train(copy.deepcopy(reference), x, steps)
    got = train(torch.compile(copy.deepcopy(reference), backend=fresh_backend()), x, steps)
    return want, got


def test_backend_is_registered_by_name():
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("ltc_cache") is ltc_cache.backend
    assert "ltc_cache" in torch._dynamo.list_backends(exclude_tags=())


def test_a_backend_and_its_cache_deep_copy_as_themselves(cache_dir):
    """Lightning (``lightning_fabric.wrappers``) replaces torch.compile with
    a wrapper that deep-copies every call's arguments, backend included: a
    backend holding a lock failed every compile once Lightning was imported."""
    backend = fresh_backend()
    cache = GraphCache(CacheConfig.from_env())
    kwargs = copy.deepcopy({"backend": backend, "cache": cache})
    assert kwargs["backend"] is backend and kwargs["cache"] is cache
    assert copy.deepcopy(LtcBackend(cache))._cache is cache
    pytest.importorskip("lightning_fabric")  # installs its wrapper on import
    model = MLP().eval()
    x = torch.randn(8, 16)
    compiled = torch.compile(model, backend=backend)
    assert compiled._compile_kwargs["backend"] is backend
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=1e-6, rtol=1e-6)


def test_inference_extracts_the_whole_graph_without_aot(cache_dir):
    from torch._dynamo.utils import counters as dynamo_counters

    model = MLP().eval()
    x = torch.randn(8, 16)
    compiled = torch.compile(model, backend="ltc_cache")
    dynamo_counters.clear()
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x), atol=1e-6, rtol=1e-6)
    assert dynamo_counters["aot_autograd"]["total"] == 0
    stats = ltc_cache.stats()
    assert stats["traces"] == 1 and stats["misses"] == 1
    assert stats["ltc_ops"] == stats["aten_ops"] > 0
    [entry] = entries(cache_dir).values()
    assert entry.kind == "graph"
    assert entry.graph_name == "MLP.inference"

    # Weights are live: new weights, new results, no new trace.
    with torch.no_grad():
        model.fc1.weight.mul_(2)
        torch.testing.assert_close(compiled(x), model(x), atol=1e-6, rtol=1e-6)
    assert ltc_cache.stats()["traces"] == 1


def test_second_compile_hits_without_tracing(cache_dir):
    model = MLP().eval()
    x = torch.randn(8, 16)
    with torch.no_grad():
        want = model(x)
        torch.compile(model, backend=fresh_backend())(x)
        torch._dynamo.reset()
        got = torch.compile(model, backend=fresh_backend())(x)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    stats = ltc_cache.stats()
    assert (stats["traces"], stats["hits"]) == (1, 1)


def test_training_matches_eager_and_is_warm_the_second_time(cache_dir):
    x = torch.randn(8, 16)
    torch.manual_seed(1)
    reference = MLP()
    want, cold = eager_and_compiled(reference, x, 5)
    names = {e.graph_name for e in entries(cache_dir).values()}
    # The two regions, and AOTAutograd's forward and backward graphs as one plan.
    assert names == {"MLP.forward.r0", "MLP.backward.r0", "MLP.training.plan"}
    assert ltc_cache.stats()["traces"] == 2
    assert ltc_cache.stats()["aot_traces"] == 1
    assert ltc_cache.stats()["plan_misses"] == 1  # the training plan's lookup

    torch._dynamo.reset()
    before = ltc_cache.stats()
    warm = train(torch.compile(copy.deepcopy(reference), backend=fresh_backend()), x, 5)
    after = ltc_cache.stats()
    assert after["traces"] == before["traces"]
    assert after["aot_traces"] == before["aot_traces"]  # no AOTAutograd in a warm start
    assert after["hits"] - before["hits"] == 3  # the plan and the two regions
    assert after["plan_hits"] - before.get("plan_hits", 0) == 1
    assert after["plan_misses"] == before["plan_misses"]
    for got in (cold, warm):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=0)
    assert cold == warm


def test_unsupported_op_runs_eagerly_between_regions(cache_dir, recwarn):
    model = WithSign().eval()
    x = torch.randn(8, 16)
    with torch.no_grad():
        got = torch.compile(model, backend=fresh_backend())(x)
        torch.testing.assert_close(got, model(x), atol=1e-6, rtol=1e-6)
    stats = ltc_cache.stats()
    assert 0 < stats["ltc_ops"] < stats["aten_ops"]
    kinds = sorted((e.graph_name, e.kind) for e in entries(cache_dir).values())
    # The whole graph is remembered as unsupported, AOTAutograd's graph of it
    # as a plan, the two regions as graphs.
    assert kinds == [("WithSign.inference", "negative"), ("WithSign.inference.plan", "plan"),
                     ("WithSign.inference.r0", "graph"), ("WithSign.inference.r1", "graph")]
    negative = next(e for e in entries(cache_dir).values() if e.kind == "negative")
    assert "aten::sign" in negative.payload["reason"]
    # Expected for real models: no warning for the whole graph.
    assert not [w for w in recwarn if "ltc_cache" in str(w.message)]

    # A new process neither traces the whole graph again nor probes ops, and
    # partitions the stored plan without AOTAutograd.
    torch._dynamo.reset()
    backend = fresh_backend()
    before = ltc_cache.stats()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend=backend)(x), model(x),
                                   atol=1e-6, rtol=1e-6)
    after = ltc_cache.stats()
    assert after["traces"] == before["traces"]
    assert after["hits"] - before["hits"] == 4
    assert after["negative_hits"] - before.get("negative_hits", 0) == 1
    assert after["plan_hits"] - before.get("plan_hits", 0) == 1
    assert after["aot_graphs"] == before["aot_graphs"]
    assert backend.op_support().probes == 0


def test_training_with_an_eager_op(cache_dir):
    x = torch.randn(8, 16)
    torch.manual_seed(2)
    want, got = eager_and_compiled(WithSign(), x, 4)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=0)
    names = {e.graph_name for e in entries(cache_dir).values()}
    assert {"WithSign.forward.r0", "WithSign.backward.r0"} <= names


def test_op_support_is_recorded_once_per_torch_version(cache_dir):
    model = WithSign().eval()
    with torch.no_grad():
        torch.compile(model, backend=fresh_backend())(torch.randn(4, 16))
    store = GraphCache(CacheConfig.from_env()).store
    key = support_record_key()
    assert len(key) != 64 and torch.__version__ in key
    record = msgpack.unpackb(store.get(key), raw=False)
    assert record["torch"] == torch.__version__
    assert record["ops"]["aten.sign.default(float32)"]  # why not, non-empty
    assert record["ops"]["aten.tanh.default(float32)"] == ""  # lowers
    support = OpSupport(store)
    assert "aten.sign.default(float32)" in support.unsupported
    assert support.probes == 0


def test_a_corrupt_op_support_record_is_probed_again(cache_dir, caplog):
    store = GraphCache(CacheConfig.from_env()).store
    store.put(support_record_key(), b"\x93not msgpack at all")
    model = WithSign().eval()
    x = torch.randn(4, 16)
    backend = fresh_backend()
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="ltc_cache.support"):
        torch.testing.assert_close(torch.compile(model, backend=backend)(x), model(x),
                                   atol=1e-6, rtol=1e-6)
    assert "unreadable" in caplog.text
    assert backend.op_support().probes > 0
    # Rewritten whole.
    assert "aten.sign.default(float32)" in OpSupport(store).unsupported


def test_a_wrong_op_record_leaves_a_negative_region_and_one_warning(cache_dir):
    """An op the record calls lowerable that is not: the region's extraction
    fails, it runs eagerly with one warning, and no later process traces it."""
    store = GraphCache(CacheConfig.from_env()).store
    support = OpSupport(store)
    support._known["aten.sign.default(float32)"] = ""  # a lie
    support._loaded = True
    support._save()

    model = WithSign().eval()
    x = torch.randn(4, 16)
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="runs eagerly") as caught:
        compiled = torch.compile(model, backend=LtcBackend(GraphCache(CacheConfig.from_env()),
                                                           whole_graph=False))
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x), atol=1e-6, rtol=1e-6)
    assert len([w for w in caught if "runs eagerly" in str(w.message)]) == 1
    kinds = sorted((e.graph_name, e.kind) for e in entries(cache_dir).values())
    assert kinds == [("WithSign.inference.plan", "plan"), ("WithSign.inference.r0", "negative")]

    torch._dynamo.reset()
    before = ltc_cache.stats()
    with torch.no_grad():
        compiled = torch.compile(model, backend=LtcBackend(GraphCache(CacheConfig.from_env()),
                                                           whole_graph=False))
        torch.testing.assert_close(compiled(x), model(x), atol=1e-6, rtol=1e-6)
    assert ltc_cache.stats()["traces"] == before["traces"]


def test_a_miss_names_the_key_part_that_differs(cache_dir, caplog):
    model = MLP().eval()
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="ltc_cache.cache"):
        torch.compile(model, backend=fresh_backend(), dynamic=False)(torch.randn(8, 16))
        assert "no entry of that name yet" in caplog.text
        caplog.clear()
        torch._dynamo.reset()
        torch.compile(model, backend=fresh_backend(), dynamic=False)(torch.randn(8, 16))
        assert "hit " in caplog.text
        caplog.clear()
        torch._dynamo.reset()
        torch.compile(model, backend=fresh_backend(), dynamic=False)(torch.randn(3, 16))
    assert "differs from the nearest entry of that name in inputs" in caplog.text


def test_a_corrupt_names_record_only_loses_the_explanation(cache_dir, caplog):
    store = GraphCache(CacheConfig.from_env()).store
    store.put("ltc_cache:names:MLP.inference", b"\xc1garbage")
    model = MLP().eval()
    x = torch.randn(8, 16)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="ltc_cache.cache"):
        torch.testing.assert_close(torch.compile(model, backend=fresh_backend())(x), model(x),
                                   atol=1e-6, rtol=1e-6)
    assert "no entry of that name yet" in caplog.text


def test_dynamic_shapes_compile_per_shape(cache_dir):
    model = MLP().eval()
    compiled = torch.compile(model, backend=fresh_backend())
    with torch.no_grad():
        for batch in (4, 6, 9, 6):
            x = torch.randn(batch, 16)
            torch.testing.assert_close(compiled(x), model(x), atol=1e-6, rtol=1e-6)
    # One entry per batch size; 6 twice is one.
    assert len(entries(cache_dir)) == 3


def test_disabled_cache_still_compiles(monkeypatch, tmp_path):
    monkeypatch.setenv("LTC_CACHE_DIR", str(tmp_path / "unused"))
    monkeypatch.setenv("LTC_CACHE_DISABLE", "1")
    model = MLP().eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="ltc_cache")(x), model(x),
                                   atol=1e-6, rtol=1e-6)
    assert not (tmp_path / "unused").exists()


def test_a_graph_of_unsupported_ops_runs_eagerly_with_one_warning(cache_dir):
    def fn(x):
        return torch.sign(torch.erf(x))

    x = torch.randn(5)
    compiled = torch.compile(fn, backend=fresh_backend())
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="lowers none") as caught:
        for _ in range(3):
            torch.testing.assert_close(compiled(x), fn(x))
    assert len([w for w in caught if "lowers none" in str(w.message)]) == 1


def test_a_failing_compiler_leaves_the_model_eager(cache_dir, monkeypatch):
    import ltc_cache.compile_backend.partition

    def broken(*args, **kwargs):
        raise ValueError("injected partitioning failure")

    monkeypatch.setattr(ltc_cache.compile_backend.partition, "partition", broken)
    x = torch.randn(8, 16)
    torch.manual_seed(3)
    reference = MLP()
    want = train(copy.deepcopy(reference), x, 3)
    with pytest.warns(RuntimeWarning, match="injected partitioning failure"):
        got = train(torch.compile(copy.deepcopy(reference), backend=fresh_backend()), x, 3)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want))
    assert ltc_cache.stats()["errors"] >= 1


def test_a_replay_that_fails_runs_eagerly_once_warned_and_remembered(cache_dir, monkeypatch):
    """Any exception in a region's first replay (here an IndexError, as a
    graph returning fewer values than it was traced with raised) runs that
    region eagerly with one warning, in training too, and leaves a negative
    entry: the next process neither replays nor traces it."""
    from ltc_cache.graph.replay import CompiledGraph

    original = CompiledGraph.__call__
    failed: list[str] = []

    def failing(self, *args):
        if self.entry.graph_name.endswith("backward.r0") and not failed:
            failed.append(self.entry.key)
            raise IndexError("tuple index out of range")
        return original(self, *args)

    monkeypatch.setattr(CompiledGraph, "__call__", failing)
    x = torch.randn(8, 16)
    torch.manual_seed(3)
    reference = MLP()
    want = train(copy.deepcopy(reference), x, 3)
    with pytest.warns(RuntimeWarning, match="does not run") as caught:
        got = train(torch.compile(copy.deepcopy(reference), backend=fresh_backend()), x, 3)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want))
    assert len([w for w in caught if "does not run" in str(w.message)]) == 1
    assert "IndexError" in str(next(w for w in caught if "does not run" in str(w.message)).message)
    assert failed
    stored = entries(cache_dir)
    assert stored[failed[0]].kind == "negative"
    assert "IndexError" in stored[failed[0]].payload["reason"]

    torch._dynamo.reset()
    monkeypatch.setattr(CompiledGraph, "__call__", original)
    before = ltc_cache.stats()
    again = train(torch.compile(copy.deepcopy(reference), backend=fresh_backend()), x, 3)
    torch.testing.assert_close(torch.tensor(again), torch.tensor(want))
    after = delta(before)
    assert after["traces"] == 0 and after["negative_hits"] == 1, after
