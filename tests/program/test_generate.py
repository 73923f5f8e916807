"""``generate()`` of language models through ltc_cache (issue 20).

The regression of the first cold ``generate()`` (a negative slice bound
read back positive, docs/torch/torchscript-ir.md#parse-ir-drops-constant-signs) and of a region that
falls back to eager on inputs laid out otherwise than traced
(docs/torch/ltc.md#flash-attention-output-follows-query-layout); cold then warm generation in fresh
child processes (``tests/children/generate.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import CHILDREN
from torch import fx

from ltc_cache.compile_backend.first_call import eager_region


def _region_traced_on_a_transposed_input() -> fx.GraphModule:
    """A region as AOTAutograd makes it after CPU flash attention: a
    ``view`` that merges two dimensions, valid only in the traced layout."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    x.meta["val"] = torch.empty(1, 7, 4, 16, device="meta").transpose(1, 2)
    t = graph.call_function(torch.ops.aten.transpose.int, (x, 1, 2))
    v = graph.call_function(torch.ops.aten.view.default, (t, [1, 7, 64]))
    graph.output((v,))
    return fx.GraphModule(torch.nn.Module(), graph)


def test_a_region_falling_back_to_eager_gets_its_inputs_in_the_traced_layout():
    region = _region_traced_on_a_transposed_input()
    x = torch.randn(1, 4, 7, 16)  # contiguous, as an LTC replay returns it
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        region(x)  # as the region's eager fallback ran before
    (out,) = eager_region(region)(x)
    torch.testing.assert_close(out, x.transpose(1, 2).reshape(1, 7, 64), rtol=0, atol=0)
    assert x.is_contiguous()  # the argument itself is left as it was


# -- generate() in child processes, cold then warm -------------------------------------

CHILD = CHILDREN / "generate.py"


def generate(model: str, lengths: list[int], *options: str) -> dict:
    """``tests/children/generate.py`` in a fresh process over the test's cache."""
    proc = subprocess.run([sys.executable, str(CHILD), model,
                           "--lengths", ",".join(map(str, lengths)), *options],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["warnings"] == [], report["warnings"]
    for request in report["requests"]:
        if request["eager"] is not None:  # greedy: eager's tokens, exactly
            assert request["tokens"] == request["eager"], request["length"]
    return report


@pytest.mark.slow  # two processes generating
def test_the_first_cold_generate_of_gpt2_no_longer_crashes(cache_dir):
    """Issue 20 as reported: a 2-layer GPT-2 (hidden 64), greedy, 16 new
    tokens, transformers' dynamic cache, the forward compiled the way
    transformers documents; cold it failed with "view size is not
    compatible". Cold and warm now give eager's tokens with no warning,
    and the warm process traces nothing and runs no AOTAutograd. (With the
    dynamic cache, ``ltc_cache.compile(model.forward)`` hands the calls to
    ``torch.compile(backend="ltc_cache")``, the other route reported.)"""
    cold = generate("gpt2", [7], "--new", "16")
    assert cold["stats"]["errors"] == 0 and cold["stats"]["traces"] > 0
    warm = generate("gpt2", [7], "--new", "16")
    assert warm["stats"]["traces"] == 0 and warm["stats"]["errors"] == 0
    assert warm["stats"].get("aot_traces", 0) == 0


@pytest.mark.slow  # two processes generating
def test_a_warm_t5_worker_with_a_static_cache_captures_and_traces_nothing(cache_dir):
    """The static cache, ``model.forward = ltc_cache.compile(model.forward)``,
    for an encoder-decoder: the cold worker stores one program per prompt
    length and one for decoding; a warm worker meeting those lengths in
    another order runs no Dynamo capture, no AOTAutograd and no LTC trace,
    and its greedy tokens are eager's. A sampled request after them, over
    the same programs, captures and traces nothing either."""
    cold = generate("t5", [5, 9], "--cache", "static")
    assert cold["captures"] > 0 and cold["stats"]["errors"] == 0
    warm = generate("t5", [9, 5], "--cache", "static", "--then-sample")
    stats = warm["stats"]
    assert warm["captures"] == 0
    assert stats.get("aot_traces", 0) == 0 and stats["traces"] == 0 and stats["misses"] == 0
    assert stats["program_hits"] == cold["stats"]["program_captures"]
    *greedy, sampled = warm["requests"]
    assert [r["length"] for r in greedy] == [9, 5] and sampled["eager"] is None
    assert len(sampled["tokens"][0]) == 1 + 8  # the decoder's start token


@pytest.mark.slow  # two processes generating, per model
@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_a_warm_worker_serves_prompt_lengths_it_never_met_from_their_buckets(cache_dir, model):
    """``ltc_cache.compile(model).generate``: every forward through the
    module's programs, each prompt padded on the left to its length bucket.
    The cold worker meets lengths 5 and 20 (buckets 8 and 32) and stores a
    program for each and one for decoding; a warm worker meeting 30, 7 and
    3, none of them seen, captures, AOTAutograd-traces and LTC-traces
    nothing. Its greedy tokens are eager's on the same padded prompt, and
    eager's on the unpadded one too."""
    cold = generate(model, [5, 20], "--route", "module", "--cache", "static")
    assert cold["stats"]["program_captures"] == 3  # two buckets and decoding
    warm = generate(model, [30, 7, 3], "--route", "module", "--cache", "static")
    stats = warm["stats"]
    assert warm["captures"] == 0 and stats.get("aot_traces", 0) == 0 and stats["traces"] == 0
    assert stats["program_hits"] == 3
    for request in warm["requests"]:
        assert request["tokens"] == request["eager_padded"] == request["eager"]
        assert len(request["tokens"][0]) == request["length"] + 8


@pytest.mark.slow  # two processes generating, per model
@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_a_warm_worker_through_the_compiled_forward_serves_new_prompt_lengths(cache_dir, model):
    """``model.forward = ltc_cache.compile(model.forward)`` and the model's
    own ``generate()`` with the static cache: the prompt's forward is padded
    on the right to its bucket and the cache's length taken back. The cold
    worker meets 5 and 20 (buckets 8 and 32) and stores a program for each
    and one for decoding; a warm worker meeting those lengths in another
    order and five it never met captures, AOTAutograd-traces and
    LTC-traces nothing, misses nothing, with eager's greedy tokens; a
    sampled request after them, over the same programs, neither."""
    cold = generate(model, [5, 20], "--cache", "static")
    assert cold["stats"]["program_captures"] == 3  # two buckets and decoding
    assert cold["captures"] > 0 and cold["stats"]["errors"] == 0
    lengths = [20, 5, 30, 7, 3, 25, 18]
    warm = generate(model, lengths, "--cache", "static", "--then-sample")
    stats = warm["stats"]
    assert warm["captures"] == 0 and stats.get("aot_traces", 0) == 0 and stats["traces"] == 0
    assert stats["misses"] == 0 and stats["program_hits"] == 3
    *greedy, sampled = warm["requests"]
    assert [r["length"] for r in greedy] == lengths and sampled["eager"] is None
    for request in warm["requests"]:  # generate() checked the greedy ones against eager's
        assert len(request["tokens"][0]) == request["length"] + 8


@pytest.mark.slow  # two processes generating
def test_a_warm_worker_through_the_torch_compile_backend_serves_new_prompt_lengths(cache_dir):
    """``model.forward = torch.compile(model.forward, backend="ltc_cache")``,
    as transformers' static-cache guide writes it, and the model's own
    ``generate()`` with the static cache: the calls into the static cache
    are served by the programs and buckets ``ltc_cache.compile(model.forward)``
    has, before Dynamo would capture them. The cold worker meets 5 and 20
    and stores a program for each bucket and one for decoding; a warm
    worker meeting five lengths it never met captures, AOTAutograd-traces
    and LTC-traces nothing, with eager's greedy tokens."""
    cold = generate("gpt2", [5, 20], "--route", "torch", "--cache", "static")
    assert cold["stats"]["program_captures"] == 3  # two buckets and decoding
    warm = generate("gpt2", [30, 7, 3, 25, 18], "--route", "torch", "--cache", "static")
    stats = warm["stats"]
    assert warm["captures"] == 0 and stats.get("aot_traces", 0) == 0 and stats["traces"] == 0
    assert stats.get("dynamo_graphs", 0) == 0 and stats["program_hits"] == 3
    for request in warm["requests"]:  # generate() checked them against eager's
        assert len(request["tokens"][0]) == request["length"] + 8
        assert request["first_token"] is not None


@pytest.mark.slow  # two programs captured and traced
def test_the_compiled_module_of_the_torch_compile_backend_pads_prompts_into_a_static_cache(
        cache_dir, dynamo_reset):
    """``torch.compile(model, backend="ltc_cache")`` called as a server calls
    it, into transformers' static cache: two prompts of one bucket (5 and 7
    tokens: 8) are one program, with no Dynamo capture of the frame, and
    their logits, cut back to the prompt, and the next step's are eager's."""
    import warnings

    from transformers import StaticCache

    import ltc_cache
    from tools.probes import captures
    from zoo.generate_models import build, prompt

    warnings.simplefilter("ignore", UserWarning)
    model = build("gpt2")
    compiled = torch.compile(model, backend="ltc_cache")
    before, captured = ltc_cache.stats(), captures()
    for n in (5, 7):
        ids = prompt(n)
        with torch.no_grad():
            cache = StaticCache(config=model.config, max_cache_len=32)
            want = model(input_ids=ids, past_key_values=cache, use_cache=True).logits
            token, at = want[:, -1:].argmax(-1), torch.tensor([[n]])
            want_next = model(input_ids=token, past_key_values=cache, use_cache=True,
                              position_ids=at).logits
            cache = StaticCache(config=model.config, max_cache_len=32)
            got = compiled(input_ids=ids, past_key_values=cache, use_cache=True).logits
            got_next = compiled(input_ids=token, past_key_values=cache, use_cache=True,
                                position_ids=at).logits
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(got_next, want_next)
    after = ltc_cache.stats()
    made = {name: after.get(name, 0) - before.get(name, 0)
            for name in ("program_captures", "dynamo_graphs")}
    # The bucket of 8 and the decoding step, captured as programs alone.
    assert made == {"program_captures": 2, "dynamo_graphs": 2}
    assert captures() - captured == 2


@pytest.mark.slow  # a fleet of two workers, then one
def test_serve_example_answers_generation_requests_warm(cache_dir, tmp_path, monkeypatch):
    """``examples/serve.py --model lm``: a cold fleet of two workers, two
    threads each, answers generation requests of random prompt lengths (up
    to 15: buckets 8 and 16) with eager's tokens; a warm worker answers
    others, of lengths the cold fleet did not meet, with no Dynamo capture,
    AOTAutograd or LTC trace."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    serve = Path(__file__).parents[2] / "examples" / "serve.py"

    def fleet(workers: int, seed: int) -> dict:
        proc = subprocess.run([sys.executable, str(serve), "--model", "lm", "--workers",
                               str(workers), "--serving-threads", "2", "--requests", "6",
                               "--seed", str(seed), "--longest", "15", "--new", "8",
                               "--threads", "1", "--check", "--json"],
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    cold = fleet(2, 0)
    assert cold["max_abs_error"] == 0 and cold["captures"] > 0
    warm = fleet(1, 100)  # other prompts, of lengths the cold fleet did not all meet
    assert warm["max_abs_error"] == 0 and set(warm["lengths"]) - set(cold["lengths"])
    assert warm["captures"] == 0 and warm["aot_traces"] == 0 and warm["traces"] == 0


def test_a_static_cache_is_keyed_by_its_state_and_a_dynamic_one_goes_to_torch_compile():
    """A program's key describes a key/value cache argument by its class and
    attributes (so equal caches share programs, another length is another
    program); an object that refers to itself has no key; a cache that
    grows every step is not laid out at all (it runs through
    torch.compile)."""
    transformers = pytest.importorskip("transformers")
    from ltc_cache.errors import GrowingLayout, UncacheableGraph
    from ltc_cache.program.loaded import call_layout
    from ltc_cache.program.program_entries import spec_text

    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4)
    ids = torch.ones(1, 1, dtype=torch.long)

    def spec(cache) -> str:
        return spec_text((), {"input_ids": ids, "cache": cache})

    a, b = (transformers.StaticCache(config=config, max_cache_len=32) for _ in range(2))
    longer = transformers.StaticCache(config=config, max_cache_len=64)
    assert spec(a) == spec(b) != spec(longer)
    assert call_layout(a) == call_layout(b) != call_layout(longer)

    class Loop:
        pass

    loop = Loop()
    loop.me = loop
    with pytest.raises(UncacheableGraph):
        spec(loop)
    with pytest.raises(GrowingLayout):
        call_layout({"cache": transformers.DynamicCache(config=config)})
