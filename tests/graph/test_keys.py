"""Cache keys: stable across processes, changed by every part."""

from __future__ import annotations

import pytest
import torch
import torch._lazy.config
from helpers import run_child

import ltc_cache.graph.graph_keys as keys
from ltc_cache.entries.keys import differing_parts
from ltc_cache.graph.graph_keys import compute_key
from zoo.corner_models import build, random_inputs


def key_for(name="weighted", inputs=None, seed=0):
    gm, shapes = build(name, seed=seed)
    return compute_key(gm, inputs if inputs is not None else random_inputs(shapes, 1))


@pytest.mark.slow  # a child process
def test_same_key_in_two_processes(cache_dir):
    here = {name: key_for(name).digest for name in ("weighted", "addcmul")}
    report = run_child("weighted", "addcmul")
    assert report["keys"] == here


def test_weights_values_do_not_change_the_key():
    assert key_for(seed=0) == key_for(seed=1)


def changed(base, other) -> list[str]:
    assert base.digest != other.digest
    return differing_parts(base.parts, other.parts)


def test_each_part_changes_the_key(monkeypatch):
    base = key_for()
    x = random_inputs([(5, 4)], 1)[0]

    assert changed(base, key_for("tensor_constant", [torch.randn(5, 4)])) == ["graph",
                                                                              "module_tensors"]
    assert changed(base, key_for(inputs=[x.double()])) == ["inputs"]
    assert changed(base, key_for(inputs=[torch.randn(6, 4)])) == ["inputs"]
    assert changed(base, key_for(inputs=[torch.randn(4, 5).t()])) == ["inputs"]  # stride
    assert changed(base, key_for(inputs=[x.clone().requires_grad_()])) == ["inputs"]

    gm, _ = build("weighted")
    gm.eval()
    assert changed(base, compute_key(gm, [x])) == ["graph"]
    gm, _ = build("weighted")
    gm.linear.weight.data = torch.randn(3, 4).t().contiguous().t()  # same shape, other stride
    assert changed(base, compute_key(gm, [x])) == ["module_tensors"]

    monkeypatch.setattr(keys, "SCHEMA_VERSION", keys.SCHEMA_VERSION + 1)
    assert changed(base, key_for()) == ["schema"]
    monkeypatch.undo()

    monkeypatch.setattr(torch, "__version__", "0.0.0")
    assert changed(base, key_for()) == ["torch"]
    monkeypatch.undo()

    monkeypatch.setenv("LTC_TS_CUDA", "1")
    assert changed(base, key_for()) == ["backend"]
    monkeypatch.undo()

    old = torch._lazy.config.get_force_fallback()
    torch._lazy.config.set_force_fallback("aten::add")
    try:
        assert changed(base, key_for()) == ["lazy_config"]
    finally:
        torch._lazy.config.set_force_fallback(old)
    assert key_for() == base


def test_python_scalars_key_by_type_and_value():
    gm, _ = build("const_scale")
    x = torch.randn(2, 3)
    k1, k2, k3 = (compute_key(gm, [x, v]) for v in (1, 2, 1.0))
    assert len({k1.digest, k2.digest, k3.digest}) == 3


def test_module_tensors_names_what_the_public_iterators_name():
    """module_tensors walks ``_modules`` itself for speed; it must name each
    tensor as ``named_parameters()`` then ``named_buffers()`` do: tied
    weights and a module registered twice once, under their first names,
    None parameters and buffers left out, non-persistent buffers kept."""
    shared = torch.nn.Linear(4, 4)
    model = torch.nn.Module()
    model.first = torch.nn.Sequential(shared, torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 4,
                                                                                     bias=False))
    model.again = shared
    model.head = torch.nn.Linear(4, 4)
    model.head.weight = model.first[2].weight  # tied
    model.register_buffer("scratch", torch.zeros(2), persistent=False)
    model.register_buffer("nothing", None)
    model.empty = torch.nn.Module()
    model.empty.register_parameter("absent", None)

    want = dict(model.named_parameters())
    want.update(model.named_buffers())
    model.graph = torch.fx.Graph()  # all module_tensors reads beside the modules
    got = keys.module_tensors(model)
    assert list(got) == list(want)
    assert all(got[name] is want[name] for name in want)
