"""A training call handed transformers' ``DynamicCache`` (a block of a model
trained with ``use_cache`` on, as FSDP2's units are called) runs its
program with a stand-in for the cache, which then holds what eager's
would (ltc_cache/program/kv_cache.py); a decoding call goes to
torch.compile as before."""

from __future__ import annotations

import pytest
import torch

import ltc_cache
from ltc_cache.program.kv_cache import FreshLayers, with_fresh_layers


@pytest.fixture
def gpt2(cache_dir, tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=96,
                                     n_positions=32, bos_token_id=0, eos_token_id=0,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return config, transformers.GPT2LMHeadModel(config).train()


def _cache(config, past: torch.Tensor | None = None):
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache(config=config)
    if past is not None:  # layer 0 filled, as the second block meets it
        cache.update(past, past * 2, 0)
    return cache


@pytest.mark.usefixtures("dynamo_reset")
def test_a_block_given_a_cache_empty_at_its_layer_in_training_runs_its_program(gpt2):
    """The second block, layer 0 of the cache filled by the first: went to
    torch.compile (a Dynamo capture in every process); now its program,
    the same output and gradient as eager's, its keys and values in the
    cache as eager's put them, and no frame of Dynamo's."""
    config, model = gpt2
    block = model.transformer.h[1]
    past = torch.randn(2, 2, 8, 16)
    x = torch.randn(2, 8, 32)
    frames = torch._dynamo.utils.counters["frames"]["ok"]
    compiled = ltc_cache.compile(block.forward)
    want_in, got_in = x.clone().requires_grad_(), x.clone().requires_grad_()
    want_cache, got_cache = _cache(config, past), _cache(config, past)
    want = block(want_in, want_cache, use_cache=True)
    got = compiled(got_in, got_cache, use_cache=True)
    assert torch.allclose(got, want, atol=1e-6)
    got.sum().backward()
    want.sum().backward()
    assert torch.allclose(got_in.grad, want_in.grad, atol=1e-5)
    for layer in (0, 1):
        assert torch.allclose(got_cache.layers[layer].keys, want_cache.layers[layer].keys)
        assert torch.allclose(got_cache.layers[layer].values, want_cache.layers[layer].values)
    stats = ltc_cache.stats()
    assert stats.get("program_captures") == 1 and stats.get("program_fallbacks", 0) == 0, stats
    assert torch._dynamo.utils.counters["frames"]["ok"] == frames

    # Decoding: a cache holding the block's layer, no grad: torch.compile, as before.
    with torch.no_grad():
        step = torch.randn(2, 1, 32)
        want_step = block(step, want_cache, use_cache=True)
        assert torch.allclose(compiled(step, got_cache, use_cache=True), want_step, atol=1e-6)
    assert ltc_cache.stats().get("program_fallbacks", 0) == 1
    assert got_cache.layers[1].keys.shape[-2] == 9  # the step's keys appended


def test_the_stand_in_is_used_only_where_the_layers_written_are_empty(gpt2):
    config, model = gpt2
    block = model.transformer.h[1]
    ran: list[str] = []

    def run(args, kwargs):
        ran.append("program")
        assert isinstance(args[0], FreshLayers)
        args[0].update(torch.ones(1, 1, 1, 1), torch.ones(1, 1, 1, 1), 1)
        return "out"

    def again(args, kwargs):
        ran.append("torch.compile")
        return "again"

    empty = _cache(config)
    assert with_fresh_layers(block, (empty,), {}, run, again) == "out"
    assert torch.equal(empty.layers[1].keys, torch.ones(1, 1, 1, 1))  # put in the cache after
    # Its layer holds keys already (a decoding step): as before.
    assert with_fresh_layers(block, (empty,), {}, run, again) == "again"
    # No module naming a layer, or no grad: as before.
    assert with_fresh_layers(None, (_cache(config),), {}, run, again) == "again"
    with torch.no_grad():
        assert with_fresh_layers(block, (_cache(config),), {}, run, again) == "again"
    assert ran == ["program", "torch.compile", "torch.compile", "torch.compile"]
