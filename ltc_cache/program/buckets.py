"""Buckets: a transformers model's variable sequence lengths (and
``generate()``'s batch sizes) padded up to a few sizes, so that a bounded
set of programs serves every length.

A program is made for one input layout: every new sequence length is a
Dynamo capture, an AOTAutograd trace and LTC traces the first time a
process meets it (about 2 s for a small GPT), and real traffic brings
hundreds of lengths. Padding is safe where its meaning is known, and for
transformers models it is: positions whose ``attention_mask`` is 0 are
never attended to, and ``labels`` of -100 are left out of the loss. So:

- ``generate()`` pads a prompt **on the left** (as transformers pads a
  batch for generation: the new tokens follow the prompt's last one; the
  positions come from the mask), and a batch with copies of its first row;
  the output is cut back to what the unpadded call returns;
- a forward that computes a loss, or runs in training mode, is padded **on
  the right**, with ``labels`` of -100; outputs of the padded length are
  cut back to the call's.

Symbolic lengths were the other way: a sequence dimension kept symbolic in
the stored Dynamo graph. LTC traces are per concrete shape anyway, and
Dynamo's symbolic guards over a saved graph were not sound across
processes here (docs/torch/dynamo.md#dynamic-length-not-sound-when-reloaded), so padding it is.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Buckets", "pad_forward", "pad_generate"]

# The -100 of transformers' losses (torch's cross_entropy ignore_index).
IGNORED_LABEL = -100
# The sequence inputs a padded forward may take, and the settings it passes
# on as they are (Trainer passes num_items_in_batch to a model that takes it).
_FORWARD_INPUTS = frozenset({"input_ids", "attention_mask", "token_type_ids", "labels"})
_FORWARD_SETTINGS = {"num_items_in_batch": None, "return_dict": None,
                     "output_hidden_states": None, "use_cache": False}
# Language models with no pad token (Llama's, Mistral's, Qwen's configs
# name none) are padded with token 0: a padded position is never attended
# to and its own outputs are cut off, so its id changes nothing. Other heads
# may read the pad token: GPT-2's classifier takes each sequence's last
# token that is not one, and without one its last token, the padding.
_ANY_PAD = ("ForCausalLM", "LMHeadModel")


@dataclass(frozen=True)
class Buckets:
    """The sizes calls are padded up to.

    ``lengths``: sequence lengths. The default ladder is 8, 16, 32 and
    then each power of two and the halfway point above it (48, 64, 96,
    128, 192, 256, ...): at most half of a padded prompt is padding, and a
    worker serving lengths up to 2**k meets about 2k programs. A length
    past the largest given bucket stays as it is (its own program).
    ``batches``: batch sizes for ``generate()``; by default powers of two.
    """

    lengths: tuple[int, ...] | None = None
    batches: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("lengths", "batches"):
            sizes = getattr(self, name)
            if sizes is None:
                continue
            sizes = tuple(sorted(set(sizes)))
            if not sizes or any(not isinstance(n, int) or n < 1 for n in sizes):
                raise ValueError(f"Buckets({name}=...): positive integers, got {sizes!r}")
            object.__setattr__(self, name, sizes)

    def length(self, n: int, limit: int | None = None) -> int:
        """The bucket of sequence length ``n``, at most ``limit`` (where a
        static cache has room for no more) and never below ``n``."""
        bucket = _next(self.lengths, n) if self.lengths is not None else _ladder(n)
        if limit is not None and bucket > limit:
            bucket = limit
        return max(bucket, n)

    def batch(self, n: int) -> int:
        """The bucket of batch size ``n``."""
        if self.batches is not None:
            return _next(self.batches, n)
        return 1 << (n - 1).bit_length()


def _next(sizes: tuple[int, ...], n: int) -> int:
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else n


def _ladder(n: int) -> int:
    """The smallest of 8, 16, 32, 48, 64, 96, 128, 192, ... at least ``n``."""
    if n <= 32:
        return max(8, 1 << (n - 1).bit_length())
    power = 1 << (n - 1).bit_length()  # n <= power < 2n
    half = power // 4 * 3
    return half if n <= half else power


def resolve(buckets: Buckets | str | None) -> Buckets | None:
    """``ltc_cache.compile``'s ``buckets`` argument: ``"auto"`` (the
    default ladders), a :class:`Buckets`, or None (no padding)."""
    if buckets == "auto":
        return Buckets()
    if buckets is None or isinstance(buckets, Buckets):
        return buckets
    raise TypeError(f"ltc_cache.compile(buckets=...): 'auto', None or ltc_cache.Buckets, "
                    f"got {buckets!r}")


# --- what is known about a model ------------------------------------------------


def _is_transformers_model(module: Any) -> bool:
    # By name: transformers need not be imported for a plain module's call.
    return any(cls.__name__ == "PreTrainedModel" for cls in type(module).__mro__)


def _pad_token(module: Any, kwargs: Mapping[str, Any]) -> int | None:
    """generate()'s pad token: the call's, the generation config's, the model's."""
    for source in (kwargs, getattr(module, "generation_config", None),
                   getattr(module, "config", None)):
        value = source.get("pad_token_id") if isinstance(source, Mapping) else \
            getattr(source, "pad_token_id", None)
        if isinstance(value, int):
            return value
    return None


# --- the forward: right padding, labels -100 ------------------------------------


def pad_forward(buckets: Buckets | None, module: Any, args: tuple[Any, ...],
                kwargs: dict[str, Any],
                call: Callable[[tuple[Any, ...], dict[str, Any]], Any]) -> Any:
    """``call(args, kwargs)``, with the sequence padded up to its bucket
    where that computes the same loss and the same outputs (cut back):

    a transformers model, not an encoder-decoder, with a pad token; called
    with keyword inputs among ``input_ids``/``attention_mask``/
    ``token_type_ids``/``labels`` and an ``attention_mask`` (and settings
    such as Trainer's ``num_items_in_batch``); with labels or
    in training mode (an inference call without labels may want the
    key/value cache it returns, which padding would lengthen). Any other
    call is made as it is."""
    padded = _forward_padding(buckets, module, args, kwargs)
    if padded is None:
        return call(args, kwargs)
    length, bucket, padded_kwargs = padded
    return _cut(call(args, padded_kwargs), bucket, length)


def _forward_padding(buckets: Buckets | None, module: Any, args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> tuple[int, int, dict[str, Any]] | None:
    if buckets is None or args or not kwargs.keys() <= _FORWARD_INPUTS | _FORWARD_SETTINGS.keys():
        return None
    if any(kwargs.get(name, only) is not only for name, only in _FORWARD_SETTINGS.items()
           if only is not None):  # use_cache=True: the cache would hold the padding
        return None
    mask, labels = kwargs.get("attention_mask"), kwargs.get("labels")
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        return None
    if labels is None and not getattr(module, "training", False):
        return None
    config = getattr(module, "config", None)
    if not _is_transformers_model(module) or getattr(config, "is_encoder_decoder", False):
        return None
    pad = getattr(config, "pad_token_id", None)
    if not isinstance(pad, int):
        if not type(module).__name__.endswith(_ANY_PAD):
            return None  # the head may find a sequence's end by its pad token
        pad = 0
    length = mask.shape[1]
    bucket = buckets.length(length)
    if bucket == length:
        return None
    fills = {"input_ids": pad, "attention_mask": 0, "token_type_ids": 0,
             "labels": IGNORED_LABEL}
    padded = {}
    for name, value in kwargs.items():
        if name in _FORWARD_SETTINGS:
            padded[name] = value
            continue
        if not isinstance(value, torch.Tensor):
            return None
        if name == "labels" and value.dim() == 1:  # one label a sequence
            padded[name] = value
            continue
        if value.dim() != 2 or value.shape != mask.shape:
            return None
        padded[name] = torch.nn.functional.pad(value, (0, bucket - length), value=fills[name])
    return length, bucket, padded


def _cut(out: Any, bucket: int, length: int) -> Any:
    """``out`` with each per-token tensor (batch, ``bucket``, features):
    logits, hidden states, cut back to ``length`` tokens. A ModelOutput is
    changed in place; a key/value cache is left as it is."""
    if isinstance(out, torch.Tensor):
        return out[:, :length] if out.dim() == 3 and out.shape[1] == bucket else out
    if isinstance(out, dict):  # transformers' ModelOutput is an OrderedDict
        for name, value in list(out.items()):
            out[name] = _cut(value, bucket, length)
        return out
    if type(out) in (tuple, list):
        return type(out)(_cut(value, bucket, length) for value in out)
    return out


# --- generate(): left padding, extra rows ---------------------------------------


def pad_generate(buckets: Buckets | None, module: Any, args: tuple[Any, ...],
                 kwargs: dict[str, Any],
                 generate: Callable[..., Any]) -> Any:
    """``generate(*args, **kwargs)`` with the prompt padded on the left up
    to its length bucket (within a static cache's ``max_cache_len``) and
    the batch up to its batch bucket (copies of the first row); the result
    cut back to the call's rows and, for a decoder-only model, to its
    prompt. A prompt given otherwise than as ``input_ids`` (embeddings,
    extra per-token inputs) is generated from as it is."""
    plan = _generate_padding(buckets, module, args, kwargs)
    if plan is None:
        return generate(*args, **kwargs)
    rows, strip, padded_kwargs = plan
    out = generate(**padded_kwargs)
    if isinstance(out, torch.Tensor):
        return out[:rows, strip:]
    if hasattr(out, "sequences"):  # return_dict_in_generate: a ModelOutput
        out.sequences = out.sequences[:rows, strip:]
        for name in ("scores", "logits"):
            steps = getattr(out, name, None)
            if isinstance(steps, tuple):
                setattr(out, name, tuple(step[:rows] for step in steps))
    return out


_GENERATE_EXTRAS = frozenset({"output_attentions", "output_hidden_states", "position_ids",
                              "token_type_ids", "inputs_embeds", "decoder_input_ids",
                              "past_key_values"})


def _generate_padding(buckets: Buckets | None, module: Any, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> tuple[int, int, dict[str, Any]] | None:
    if buckets is None or len(args) > 1 or (args and "input_ids" in kwargs):
        return None
    ids = args[0] if args else kwargs.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype != torch.long:
        return None
    if any(kwargs.get(name) is not None and kwargs[name] is not False
           for name in _GENERATE_EXTRAS):
        return None
    mask = kwargs.get("attention_mask")
    if mask is None:
        mask = torch.ones_like(ids)
    elif not isinstance(mask, torch.Tensor) or mask.shape != ids.shape:
        return None
    config = getattr(module, "config", None)
    decoder_only = not getattr(config, "is_encoder_decoder", False)
    pad = _pad_token(module, kwargs)
    if pad is None:
        eos = getattr(getattr(module, "generation_config", None), "eos_token_id", None)
        pad = eos[0] if isinstance(eos, list) and eos else eos if isinstance(eos, int) else 0
    rows, length = ids.shape
    # At least one position of padding: generate() drops a mask of all ones,
    # and the forwards without one are other programs (the prompt's and
    # every decoding step's), so a prompt as long as its bucket goes to the
    # next one.
    bucket = buckets.length(length + 1, _room(module, kwargs, length) if decoder_only else None)
    batch = buckets.batch(rows)
    if bucket == length and batch == rows:
        return None
    extra = bucket - length
    ids = torch.nn.functional.pad(ids, (extra, 0), value=pad)
    mask = torch.nn.functional.pad(mask, (extra, 0), value=0)
    if batch > rows:
        ids = torch.cat([ids, ids[:1].expand(batch - rows, -1)])
        mask = torch.cat([mask, mask[:1].expand(batch - rows, -1)])
    padded = dict(kwargs, input_ids=ids, attention_mask=mask)
    if decoder_only:
        _lengthen_limits(module, padded, extra)
    return rows, extra if decoder_only else 0, padded


def _room(module: Any, kwargs: Mapping[str, Any], length: int) -> int | None:
    """The longest prompt a static cache of ``max_cache_len`` has room for
    with the call's new tokens; None where no length is set."""
    config = getattr(module, "generation_config", None)
    cache_len = kwargs.get("max_cache_len")
    new = kwargs.get("max_new_tokens", getattr(config, "max_new_tokens", None))
    if not isinstance(cache_len, int):
        return None
    if not isinstance(new, int):
        limit = kwargs.get("max_length", getattr(config, "max_length", None))
        new = limit - length if isinstance(limit, int) else 0
    return max(cache_len - new, 1)


def _lengthen_limits(module: Any, kwargs: dict[str, Any], extra: int) -> None:
    """``max_length``/``min_length`` count the prompt: padding adds to
    them, so the call makes as many new tokens as it would unpadded."""
    config = getattr(module, "generation_config", None)
    if kwargs.get("max_new_tokens", getattr(config, "max_new_tokens", None)) is None:
        limit = kwargs.get("max_length", getattr(config, "max_length", None))
        if isinstance(limit, int):
            kwargs["max_length"] = limit + extra
    if kwargs.get("min_new_tokens", getattr(config, "min_new_tokens", None)) is None:
        least = kwargs.get("min_length", getattr(config, "min_length", None))
        if isinstance(least, int) and least > 0:
            kwargs["min_length"] = least + extra
