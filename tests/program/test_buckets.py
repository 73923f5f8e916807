"""Buckets (``ltc_cache/program/buckets.py``): sequence lengths, and
``generate()``'s batch sizes, padded up to a few sizes where transformers'
attention mask and ignored labels make the padding invisible.

The padding itself is checked eagerly (the same loss, logits and tokens as
the unpadded call); the warm start over buckets in child processes, cold
then warm (generation in ``test_generate.py``)."""

from __future__ import annotations

import inspect
import json
import logging
import subprocess
import sys
import warnings

import pytest
import torch
import transformers
from helpers import CHILDREN

import ltc_cache
from ltc_cache.program.buckets import Buckets, pad_forward, pad_generate
from zoo.generate_models import build as build_lm
from zoo.generate_models import generation_kwargs, prompt
from zoo.padded_models import batch
from zoo.padded_models import build as build_trained

warnings.filterwarnings("ignore", message=".*token_id must be.*")


def test_the_default_ladder_is_powers_of_two_and_the_halfway_points_above_32():
    buckets = Buckets()
    assert [buckets.length(n) for n in (1, 8, 9, 17, 33, 48, 49, 65, 97, 129, 193)] == \
        [8, 8, 16, 32, 48, 48, 64, 96, 128, 192, 256]
    assert [buckets.batch(n) for n in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]


def test_a_limit_caps_the_bucket_and_a_length_past_the_buckets_stays_as_it_is():
    assert Buckets().length(130, limit=150) == 150  # the static cache's room
    assert Buckets().length(130, limit=120) == 130  # no room: its own length
    given = Buckets(lengths=(64, 16), batches=(4,))
    assert given.lengths == (16, 64)
    assert [given.length(n) for n in (3, 17, 65)] == [16, 64, 65]
    assert [given.batch(n) for n in (1, 4, 5)] == [4, 4, 5]


@pytest.mark.parametrize("bad", [(), (0, 8), (8.5,)])
def test_bucket_sizes_must_be_positive_integers(bad):
    with pytest.raises(ValueError, match="positive integers"):
        Buckets(lengths=bad)


def test_compile_refuses_a_buckets_argument_it_does_not_know():
    with pytest.raises(TypeError, match="buckets"):
        ltc_cache.compile(torch.nn.Linear(2, 2), buckets="always")


def _record(model):
    """A call that records the keyword arguments it is made with and runs
    ``model`` eagerly."""
    seen = []

    def call(args, kwargs):
        seen.append(kwargs)
        return model(*args, **kwargs)

    return call, seen


def test_a_training_forward_is_padded_on_the_right_and_computes_the_same_loss():
    """A causal LM's loss and logits, padded from 13 to 16 tokens (mask 0,
    labels -100), equal the unpadded call's; the logits come back cut to
    13 tokens and gradients flow. Trainer's ``num_items_in_batch`` is
    passed on."""
    model = build_trained("gpt2")
    inputs = batch(13, 0)
    expected = model(**inputs, num_items_in_batch=40)
    call, seen = _record(model)
    out = pad_forward(Buckets(), model, (), dict(inputs, num_items_in_batch=40), call)
    assert seen[0]["input_ids"].shape == (4, 16) and seen[0]["num_items_in_batch"] == 40
    assert seen[0]["labels"][:, 13:].eq(-100).all()
    assert seen[0]["attention_mask"][:, 13:].eq(0).all()
    assert out.logits.shape == expected.logits.shape
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.logits, expected.logits, rtol=1e-5, atol=1e-5)
    out.loss.backward()
    assert model.transformer.wte.weight.grad is not None


def test_a_language_model_with_no_pad_token_is_padded_with_any_token():
    """Llama's configs name no pad token: a call is padded with token 0
    all the same, and its loss and logits are the unpadded call's."""
    model = build_trained("llama")
    model.config.pad_token_id = None
    inputs = batch(13, 0)
    expected = model(**inputs)
    call, seen = _record(model)
    out = pad_forward(Buckets(), model, (), dict(inputs), call)
    assert seen[0]["input_ids"].shape == (4, 16) and seen[0]["input_ids"][:, 13:].eq(0).all()
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.logits, expected.logits, rtol=1e-5, atol=1e-5)


def test_a_training_forward_without_an_attention_mask_gets_one():
    """A causal LM fed from a token stream: ``input_ids`` and ``labels``,
    no mask. The padded call has the mask the model assumes without one
    (ones over the tokens, zeros over the padding) and the same loss; a
    batch already at its bucket's length gets the mask of ones too, so that
    every call of a bucket has one layout."""
    model = build_trained("gpt2")
    for length, bucket in ((13, 16), (16, 16)):
        inputs = {k: v for k, v in batch(length, 0).items() if k != "attention_mask"}
        expected = model(**inputs)
        call, seen = _record(model)
        out = pad_forward(Buckets(), model, (), dict(inputs), call)
        assert seen[-1]["input_ids"].shape == (4, bucket)
        mask = seen[-1]["attention_mask"]
        assert mask[:, :length].eq(1).all() and mask[:, length:].eq(0).all()
        assert seen[-1]["labels"][:, length:].eq(-100).all()
        assert out.logits.shape == expected.logits.shape
        torch.testing.assert_close(out.loss, expected.loss, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out.logits, expected.logits, rtol=1e-5, atol=1e-5)


def _padding_forward(model, seen):
    """``model.forward`` through pad_forward, eagerly, recording each call's
    arguments; it shows the forward's signature, from which ``generate()``
    decides what to pass (position_ids, logits_to_keep), as it does for a
    compiled forward."""
    forward = model.forward

    def padded(*args, **kwargs):
        return pad_forward(Buckets(), model, args, kwargs,
                           lambda a, k: seen.append(k) or forward(*a, **k))

    padded.__signature__ = inspect.signature(forward)
    return padded


@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen2"])
def test_a_static_cache_prefill_is_padded_on_the_right_and_decoding_follows_the_prompt(name):
    """``model.forward`` compiled as transformers documents, with the static
    cache: the prompt's forward (11 tokens, and a batch of two the caller
    left-padded) runs at its bucket, 16, padded on the right (with the
    prompt's last token, not the pad token transformers warns of); the
    cache's length is taken back to the prompt's, so every decoding step
    runs as unpadded, and the tokens are eager's. Qwen2 is given its masks
    as a dict by layer kind."""
    model = build_lm(name)
    kwargs = generation_kwargs("static", False, 6)
    ids = torch.cat([prompt(11, 0), prompt(11, 1)])
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    with torch.no_grad():
        expected = [model.generate(ids[:1], **kwargs),
                    model.generate(ids, attention_mask=mask, **kwargs)]
        seen = []
        model.forward = _padding_forward(model, seen)
        out = model.generate(ids[:1], **kwargs)
        assert seen[0]["input_ids"].shape == (1, 16)
        assert seen[0]["input_ids"][0, 11:].eq(ids[0, -1]).all()
        assert seen[0]["position_ids"][0].tolist() == list(range(16))
        assert seen[0]["logits_to_keep"].tolist() == [10]  # the prompt's last token
        assert [k["input_ids"].shape for k in seen[1:]] == [(1, 1)] * 5
        assert torch.equal(out, expected[0])
        seen.clear()
        out = model.generate(ids, attention_mask=mask, **kwargs)
        # generate() hands the prefill a 4-D mask (rows: queries, columns: cache
        # positions): the padding's rows attend causally, the prompt's never see it.
        mask = seen[0]["attention_mask"]
        mask = mask["full_attention"] if isinstance(mask, dict) else mask
        rows = mask[1, 0, :, :16].int().tolist()
        assert rows[10] == [0] * 3 + [1] * 8 + [0] * 5
        assert rows[15] == [1] * 16
        assert torch.equal(out, expected[1])


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_one_token_prompt_is_padded_into_its_bucket_as_longer_prompts_are(name):
    """generate() gives a one-token prompt into a static cache a 4-D causal
    mask and longer prompts none (the model makes that same mask itself):
    the one-token prefill is padded to its bucket with the mask left out,
    so that it is called as a longer prompt of its bucket is (one program
    for the bucket), and its tokens are eager's. A mask that hides a
    position is kept."""
    model = build_lm(name)
    kwargs = generation_kwargs("static", False, 4)
    with torch.no_grad():
        expected = model.generate(prompt(1), **kwargs)
        seen = []
        forward = model.forward
        model.forward = _padding_forward(model, seen)
        out = model.generate(prompt(1), **kwargs)
        one = seen[0]
        seen.clear()
        model.generate(prompt(5), **kwargs)
        five = seen[0]
        model.forward = forward
    assert one["input_ids"].shape == five["input_ids"].shape == (1, 8)
    assert "attention_mask" not in one and set(one) == set(five)
    assert torch.equal(out, expected)
    from ltc_cache.program.buckets import plain_causal

    causal = torch.ones(1, 1, 3, 8, dtype=torch.bool).tril()
    assert plain_causal(causal, None)
    assert plain_causal(torch.zeros(causal.shape).masked_fill(~causal, torch.finfo().min), None)
    hidden = causal.clone()
    hidden[..., 2, 0] = False  # a left-padded row's position
    assert not plain_causal(hidden, None)
    assert not plain_causal(causal, torch.tensor([[3, 4, 5]]))  # a cache already filled


def test_a_prefill_is_not_padded_past_the_cache_or_with_outputs_it_would_lengthen():
    """A prompt whose bucket the static cache has no room for is padded to
    the cache's length; one asking for hidden states, or with a dynamic
    cache, is made as it is."""
    model = build_lm("gpt2")
    ids = prompt(11)

    def first_forward(**kwargs):
        seen = []
        forward = model.forward
        model.forward = _padding_forward(model, seen)
        try:
            with torch.no_grad():
                model.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0, **kwargs)
        finally:
            model.forward = forward
        return seen[0]

    assert first_forward(cache_implementation="static", max_cache_len=14)["input_ids"].shape \
        == (1, 14)
    assert first_forward(cache_implementation="static", max_cache_len=64,
                         output_hidden_states=True, return_dict_in_generate=True
                         )["input_ids"].shape == (1, 11)
    assert first_forward()["input_ids"].shape == (1, 11)  # the dynamic cache


def test_many_lengths_that_cannot_be_padded_are_told_once_at_info(monkeypatch, caplog):
    """Nine distinct lengths a transformers model cannot pad (inference
    calls without labels) log one INFO line naming why; more lengths log
    nothing more. Lengths that are padded are not counted."""
    from ltc_cache.program import buckets as module

    monkeypatch.setattr(module, "_unpadded", set())
    monkeypatch.setattr(module, "_unpadded_told", False)
    model = build_trained("gpt2").eval()
    call = lambda args, kwargs: None  # noqa: E731
    with caplog.at_level(logging.INFO, logger="ltc_cache.buckets"):
        for length in range(9, 20):  # padded: labels
            pad_forward(Buckets(), model, (), dict(batch(length, 0)), call)
        for length in range(3, 11):
            pad_forward(Buckets(), model, (), {"input_ids": batch(length, 0)["input_ids"]}, call)
        assert ours(caplog) == []
        for length in range(11, 14):
            pad_forward(Buckets(), model, (), {"input_ids": batch(length, 0)["input_ids"]}, call)
    (record,) = ours(caplog)
    assert record.levelno == logging.INFO
    assert "9 sequence lengths" in record.getMessage()
    assert "an inference call without labels" in record.getMessage()


def ours(caplog):
    return [r for r in caplog.records if r.name == "ltc_cache.buckets"]


def test_calls_whose_padding_is_not_known_are_made_as_they_are():
    """No padding for: an inference call without labels, or one asking for
    the key/value cache (it would hold the padding), a model without a pad
    token whose head may read it (a classifier), a module that is not
    transformers', positional inputs, extra
    per-token inputs, or buckets turned off."""
    model, inference = build_trained("gpt2"), build_trained("gpt2").eval()
    inputs = batch(13, 0)
    cases = [(Buckets(), inference, (), {k: inputs[k] for k in ("input_ids", "attention_mask")}),
             (None, model, (), dict(inputs)),
             (Buckets(), model, (inputs["input_ids"],), {}),
             (Buckets(), model, (), dict(inputs, position_ids=inputs["attention_mask"])),
             (Buckets(), model, (), dict(inputs, use_cache=True))]
    for buckets, module, args, kwargs in cases:
        call, seen = _record(module)
        pad_forward(buckets, module, args, kwargs, call)
        assert seen[0] is kwargs
    no_pad = transformers.GPT2ForSequenceClassification(build_trained("gpt2").config).train()
    no_pad.config.pad_token_id = None
    seen = []
    pad_forward(Buckets(), no_pad, (), dict(inputs, labels=inputs["labels"][:, 0] % 2),
                lambda args, kwargs: seen.append(kwargs))
    assert seen[0]["input_ids"].shape == (4, 13)
    plain = torch.nn.Linear(4, 4)
    call, seen = _record(lambda **kw: kw)
    pad_forward(Buckets(), plain, (), dict(inputs), call)
    assert seen[0]["input_ids"].shape == (4, 13)


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_generate_pads_the_prompt_and_the_batch_and_cuts_the_answer_back(name):
    """Three prompts (left-padded to 11 by the user, as transformers pads a
    batch) go in as four rows of 16 tokens; what comes back is the three
    rows' answers, the prompt as given (a decoder) and the new tokens,
    equal to eager's unpadded ones. ``max_length`` counts the prompt: the
    padded call makes as many new tokens."""
    model = build_lm(name)
    ids = torch.cat([prompt(11, seed) for seed in range(3)])
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    ids = ids.masked_fill(mask == 0, 0)
    kwargs = dict(attention_mask=mask, do_sample=False, pad_token_id=0, max_new_tokens=6)
    seen = []

    def generate(**padded):
        seen.append(padded)
        return model.generate(**padded)

    with torch.no_grad():
        expected = model.generate(ids, **kwargs)
        out = pad_generate(Buckets(), model, (ids,), dict(kwargs), generate)
        assert seen[0]["input_ids"].shape == (4, 16)
        assert torch.equal(out, expected)
        if name == "gpt2":  # max_length, not max_new_tokens: the same new tokens
            del kwargs["max_new_tokens"]
            out = pad_generate(Buckets(), model, (ids,), dict(kwargs, max_length=17), generate)
            assert out.shape == (3, 17)
            assert torch.equal(out, model.generate(ids, **kwargs, max_length=17))


def test_a_dict_output_of_generate_is_cut_back_too():
    model = build_lm("gpt2")
    ids = prompt(5)
    with torch.no_grad():
        out = pad_generate(Buckets(), model, (ids,), dict(
            do_sample=False, pad_token_id=0, max_new_tokens=3, return_dict_in_generate=True,
            output_scores=True), model.generate)
    assert out.sequences.shape == (1, 8) and torch.equal(out.sequences[:, :5], ids)
    assert len(out.scores) == 3 and out.scores[0].shape[0] == 1


# -- training over lengths in child processes, cold then warm ---------------------------

CHILD = CHILDREN / "lengths.py"


def _train(lengths: list[int], *options: str) -> dict:
    proc = subprocess.run([sys.executable, str(CHILD), "--lengths", ",".join(map(str, lengths)),
                           *options], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# The warm process's lengths, none of them met cold: three, or ten where
# the batches come without an attention mask (a causal LM fed input_ids and
# labels alone).
WARM_LENGTHS = {"": [12, 45, 10], "--no-mask": [12, 45, 10, 35, 14, 41, 11, 47, 13, 33]}


@pytest.mark.slow  # two processes training
@pytest.mark.parametrize("option", list(WARM_LENGTHS), ids=["with masks", "without masks"])
def test_a_warm_training_process_meets_lengths_it_never_met_with_no_capture(cache_dir, option):
    """Dynamic padding: each batch its own length. The cold process trains
    on lengths 9 and 40 (buckets 16 and 48); the warm one on lengths it
    never met, in those buckets: no Dynamo capture, AOTAutograd or LTC
    trace, and losses equal to eager's on the unpadded batches within 1e-5."""
    options = [option] if option else []
    cold = _train([9, 40], *options)
    assert cold["stats"]["program_captures"] == 2
    warm = _train(WARM_LENGTHS[option], *options)
    stats = warm["stats"]
    assert stats.get("program_captures", 0) == 0 and warm["frames"] == 0
    assert stats.get("aot_traces", 0) == 0 and stats["traces"] == 0
    assert stats["program_hits"] == 2
    for run in (cold, warm):
        torch.testing.assert_close(run["losses"], run["eager"], rtol=1e-5, atol=1e-6)
