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
  the right**, with ``labels`` of -100 (and, given no ``attention_mask``,
  the mask of ones the model would assume); outputs of the padded length
  are cut back to the call's;
- a prompt's forward into an empty static key/value cache (``generate()``
  through ``model.forward = ltc_cache.compile(model.forward)``) is padded
  **on the right** too, and the cache's length taken back to the prompt's
  after it: the padding's keys and values are written over by the decoding
  steps before any query may see them
  (docs/torch/frameworks.md#static-cache-prefill-padding).

Symbolic lengths were the other way: a sequence dimension kept symbolic in
the stored Dynamo graph. LTC traces are per concrete shape anyway, and
Dynamo's symbolic guards over a saved graph were not sound across
processes here (docs/torch/dynamo.md#dynamic-length-not-sound-when-reloaded), so padding it is.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import BadArgument, WrongType

__all__ = ["UNPADDED_LENGTHS", "Buckets", "into_static_cache", "is_transformers_model",
           "pad_forward", "pad_generate", "plain_causal"]

logger = logging.getLogger("ltc_cache.buckets")

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
                raise BadArgument(f"Buckets({name}=...): positive integers, got {sizes!r}")
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
    raise WrongType(f"ltc_cache.compile(buckets=...): 'auto', None or ltc_cache.Buckets, "
                    f"got {buckets!r}")


# --- what is known about a model ------------------------------------------------


def is_transformers_model(module: Any) -> bool:
    """Whether ``module`` is a transformers model (a ``PreTrainedModel``)."""
    # By name: transformers need not be imported for a plain module's call.
    return any(cls.__name__ == "PreTrainedModel" for cls in type(module).__mro__)


def into_static_cache(kwargs: Mapping[str, Any]) -> bool:
    """Whether a forward's keyword arguments pass one key/value cache, and
    it is transformers' static one (what ``generate()`` makes with
    ``cache_implementation="static"``)."""
    caches = [kwargs[name] for name in _CACHE_NAMES if kwargs.get(name) is not None]
    return len(caches) == 1 and _static_layers(caches[0]) is not None


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


@dataclass
class _Padded:
    """A forward's call padded from ``length`` to ``bucket`` tokens, and the
    static cache layers (a prompt's prefill) whose length to take back by
    the padding once it has run."""

    length: int
    bucket: int
    kwargs: dict[str, Any]
    layers: tuple[Any, ...] = ()


def pad_forward(buckets: Buckets | None, module: Any, args: tuple[Any, ...],
                kwargs: dict[str, Any],
                call: Callable[[tuple[Any, ...], dict[str, Any]], Any]) -> Any:
    """``call(args, kwargs)``, with the sequence padded up to its bucket
    where that computes the same loss and the same outputs (cut back).

    Padded, for a transformers model that is not an encoder-decoder and has
    a pad token (or is a causal language model), called with keyword
    arguments only:

    - a forward with ``labels`` or in training mode, whose inputs are among
      ``input_ids``/``attention_mask``/``token_type_ids``/``labels`` (and
      settings such as Trainer's ``num_items_in_batch``): on the right, the
      mask 0 and the labels -100 over the padding. Without an
      ``attention_mask`` one of ones is added (what the model assumes when
      given none);
    - a prompt's prefill into an empty static key/value cache (``cache`` or
      ``past_key_values``), as ``generate()`` with
      ``cache_implementation="static"`` makes it through a compiled
      ``model.forward``: ``input_ids``, and perhaps ``position_ids``,
      ``logits_to_keep`` and an attention mask (2-D, or 4-D over the
      cache): on the right, within the cache's ``max_cache_len``. Causal
      attention never lets a prompt's token see the padding after it, and
      the cache's length is taken back to the prompt's, so the first
      decoding step writes over the padding's keys and values before any
      query could see them.

    Any other call is made as it is; a transformers model meeting many
    lengths it cannot pad is told so once, at INFO."""
    if buckets is None:
        return call(args, kwargs)
    padded = _forward_padding(buckets, module, args, kwargs)
    if not isinstance(padded, _Padded):
        if padded is not None:
            _note_unpadded(module, args, kwargs, padded)
        return call(args, kwargs)
    out = call(args, padded.kwargs)
    for layer in padded.layers:
        layer.crop(padded.length - padded.bucket)  # a negative count: tokens to take back
    return _cut(out, padded.bucket, padded.length)


def _forward_padding(buckets: Buckets, module: Any, args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> _Padded | str | None:
    """How to pad the call; else why not (None: it needs no padding, or
    has no sequence to pad)."""
    if not is_transformers_model(module):
        return None
    if args:
        return "positional arguments"
    config = getattr(module, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return "an encoder-decoder model"
    pad = getattr(config, "pad_token_id", None)
    if not isinstance(pad, int):
        if not type(module).__name__.endswith(_ANY_PAD):
            return "no pad token"  # the head may find a sequence's end by its pad token
        pad = 0
    if _CACHE_NAMES & kwargs.keys():
        return _prefill_padding(buckets, module, kwargs)
    if not kwargs.keys() <= _FORWARD_INPUTS | _FORWARD_SETTINGS.keys():
        return "inputs " + ", ".join(sorted(kwargs.keys() - _FORWARD_INPUTS -
                                            _FORWARD_SETTINGS.keys()))
    if any(kwargs.get(name, only) is not only for name, only in _FORWARD_SETTINGS.items()
           if only is not None):  # use_cache=True: the cache would hold the padding
        return "use_cache=True"
    mask, labels, ids = kwargs.get("attention_mask"), kwargs.get("labels"), \
        kwargs.get("input_ids")
    if labels is None and not getattr(module, "training", False):
        return "an inference call without labels"
    added = mask is None and isinstance(ids, torch.Tensor) and ids.dim() == 2
    if added:
        # What the model assumes when given none; added even where no
        # padding is needed, so that every such call of a bucket's length
        # has one layout (docs/torch/frameworks.md#no-mask-means-ones).
        mask = torch.ones_like(ids)
        kwargs = dict(kwargs, attention_mask=mask)
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        return "an attention mask that is not 2-D"
    length = mask.shape[1]
    bucket = buckets.length(length)
    if bucket == length:
        return _Padded(length, length, kwargs) if added else None
    fills = {"input_ids": pad, "attention_mask": 0, "token_type_ids": 0,
             "labels": IGNORED_LABEL}
    padded = {}
    for name, value in kwargs.items():
        if name in _FORWARD_SETTINGS:
            padded[name] = value
            continue
        if not isinstance(value, torch.Tensor):
            return f"a {name} that is not a tensor"
        if name == "labels" and value.dim() == 1:  # one label a sequence
            padded[name] = value
            continue
        if value.dim() != 2 or value.shape != mask.shape:
            return f"a {name} not shaped as the attention mask"
        padded[name] = torch.nn.functional.pad(value, (0, bucket - length), value=fills[name])
    return _Padded(length, bucket, padded)


# The names a key/value cache is passed under (transformers 5 ``cache``,
# earlier releases ``past_key_values``), and what a prefill's call may hold
# besides it: settings passed on as they are, where they hold these values.
_CACHE_NAMES = frozenset({"cache", "past_key_values"})
_PREFILL_INPUTS = frozenset({"input_ids", "attention_mask", "position_ids", "logits_to_keep"})
_PREFILL_SETTINGS = {"use_cache": None, "return_dict": None,
                     "output_attentions": False, "output_hidden_states": False}


def _prefill_padding(buckets: Buckets, module: Any,
                     kwargs: dict[str, Any]) -> _Padded | str | None:
    """A prompt's first forward into an empty static cache, padded on the
    right to its bucket (at most the cache's length).

    Its ``position_ids`` go on counting over the padding; ``logits_to_keep``
    (``generate()`` asks for the last position's logits alone, which would
    be the padding's) becomes the tensor of the positions it names, counted
    from the prompt's end, as transformers' causal language models take it;
    made a tensor at a bucket's own length too, so that every prompt of a
    bucket has one layout."""
    names = kwargs.keys() - _PREFILL_INPUTS - _PREFILL_SETTINGS.keys()
    if len(names) != 1 or not names <= _CACHE_NAMES:
        extra = sorted(names - _CACHE_NAMES)
        return "inputs " + ", ".join(extra) if extra else "two key/value caches"
    layers = _static_layers(kwargs[next(iter(names))])
    if layers is None:
        return "a key/value cache that is not transformers' static one"
    if any(_filled(layer) for layer in layers):
        return None  # a decoding step: one token, nothing to pad
    if any(kwargs.get(name, only) not in (None, only) for name, only in _PREFILL_SETTINGS.items()
           if only is not None):
        return "outputs of attentions or hidden states"
    ids = kwargs.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return "no input_ids"
    length = ids.shape[1]
    positions, mask = kwargs.get("position_ids"), kwargs.get("attention_mask")
    if positions is not None and (not isinstance(positions, torch.Tensor)
                                  or positions.shape != ids.shape):
        return "position_ids not shaped as the input_ids"
    masks = _prefill_masks(mask, ids)
    if masks is None:
        return "an attention mask that is neither 2-D nor 4-D over the cache"
    keep = kwargs.get("logits_to_keep")
    counted = isinstance(keep, int) and not isinstance(keep, bool) and 0 <= keep <= length
    if keep is not None and not counted:
        return "a logits_to_keep that is not a count of positions"
    room = min(layer.max_cache_len for layer in layers)
    room = min([room, *(m.shape[3] for m in masks if m.dim() == 4)])
    most = getattr(getattr(module, "config", None), "max_position_embeddings", None)
    if isinstance(most, int):  # positions past the model's would fail, not pad
        room = min(room, most)
    bucket = buckets.length(length, room)
    causal = plain_causal(mask, positions)
    if bucket == length and not keep and not causal:
        return None
    padded = dict(kwargs)
    if causal:
        # generate() gives a one-token prompt the 4-D causal mask it leaves
        # out for longer ones, where the model makes that same mask itself
        # from the cache's positions: left out here too, so that a bucket is
        # one program whatever the length of its prompts.
        del padded["attention_mask"]
        mask = None
    if keep:
        padded["logits_to_keep"] = torch.arange(length - keep, length, device=ids.device)
    if bucket > length:
        extra = bucket - length
        # Any token: none of the prompt's sees it. Its last one, not the pad
        # token, which transformers warns of in a call without a mask.
        padded["input_ids"] = torch.cat([ids, ids[:, -1:].expand(-1, extra)], dim=1)
        if isinstance(mask, dict):  # one a layer kind (transformers 5's hybrid models)
            padded["attention_mask"] = {kind: _pad_prefill_mask(m, length, bucket)
                                        for kind, m in mask.items()}
        elif mask is not None:
            padded["attention_mask"] = _pad_prefill_mask(mask, length, bucket)
        if positions is not None:
            more = positions[:, -1:] + torch.arange(1, extra + 1, device=positions.device)
            padded["position_ids"] = torch.cat([positions, more.to(positions.dtype)], dim=1)
    return _Padded(length, bucket, padded, layers if bucket > length else ())


_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _prefill_masks(mask: Any, ids: torch.Tensor) -> list[torch.Tensor] | None:
    """The tensors of a prefill's attention mask where padding knows it
    (None where it does not): none, a mask 2-D as the ``input_ids``, or
    4-D over the cache (batch, heads, the prompt's queries, cache
    positions; boolean or additive), or a dict of such by layer kind."""
    values = list(mask.values()) if isinstance(mask, dict) else [mask]
    tensors = [value for value in values if value is not None]
    for value in tensors:
        if not isinstance(value, torch.Tensor):
            return None
        if value.shape == ids.shape:
            continue
        if not (value.dim() == 4 and value.shape[0] == ids.shape[0]
                and value.shape[2] == ids.shape[1] and value.dtype in (torch.bool, *_FLOATS)):
            return None
    return tensors


def plain_causal(mask: Any, positions: torch.Tensor | None) -> bool:
    """Whether ``mask`` is a 4-D prefill mask that lets each query of the
    prompt see the cache positions up to its own and no other (True or 0
    where it sees, False or the dtype's least where not): the mask the
    model makes itself from an empty cache's positions, given none."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
        return False
    length = mask.shape[2]
    queries = torch.arange(length, device=mask.device)
    if positions is not None and not torch.equal(positions, queries.expand_as(positions)):
        return False
    seen = torch.arange(mask.shape[3], device=mask.device)[None, :] <= queries[:, None]
    if mask.dtype == torch.bool:
        want = seen
    else:
        want = torch.zeros(seen.shape, dtype=mask.dtype, device=mask.device).masked_fill(
            ~seen, torch.finfo(mask.dtype).min)
    return torch.equal(mask, want.expand_as(mask))


def _pad_prefill_mask(mask: torch.Tensor | None, length: int, bucket: int) -> Any:
    if mask is None:
        return None
    if mask.dim() == 2:
        return torch.nn.functional.pad(mask, (0, bucket - length), value=0)
    return _causal_rows(mask, length, bucket)


def _causal_rows(mask: torch.Tensor, length: int, bucket: int) -> torch.Tensor:
    """A 4-D prefill mask (batch, heads, queries, cache positions; True or
    0 where a query attends) with rows for the padding's queries: each
    attends causally, to the cache positions up to its own, so that none is
    masked whole (a row masked whole can make its outputs, and so the
    padding's keys and values, NaN)."""
    queries = torch.arange(length, bucket, device=mask.device)[:, None]
    seen = torch.arange(mask.shape[3], device=mask.device)[None, :] <= queries
    if mask.dtype == torch.bool:
        rows = seen
    else:
        rows = torch.zeros(seen.shape, dtype=mask.dtype, device=mask.device).masked_fill(
            ~seen, torch.finfo(mask.dtype).min)
    rows = rows.expand(mask.shape[0], mask.shape[1], -1, -1)
    return torch.cat([mask, rows], dim=2)


def _static_layers(cache: Any) -> tuple[Any, ...] | None:
    """The layers of ``cache`` where it is transformers' static cache of
    full-attention layers; None otherwise (a dynamic cache, sliding
    windows)."""
    layers = getattr(cache, "layers", None)
    if not isinstance(layers, list) or not layers:
        return None
    for layer in layers:
        cls = type(layer)
        if cls.__name__ != "StaticLayer" or cls.__module__ != "transformers.cache_utils":
            return None
        held = getattr(layer, "cumulative_length", None)
        if not isinstance(held, torch.Tensor) or held.dim() != 0 \
                or not isinstance(getattr(layer, "max_cache_len", None), int):
            return None
    return tuple(layers)


def _filled(layer: Any) -> bool:
    """Whether a static cache layer holds any position."""
    return int(layer.cumulative_length) != 0


# A transformers model meeting more distinct sequence lengths than this that
# it cannot pad (each a program, captured or loaded) is told so, once a
# process, at INFO.
UNPADDED_LENGTHS = 8
_unpadded: set[int] = set()
_unpadded_told = False
_unpadded_lock = threading.Lock()


def _note_unpadded(module: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                   reason: str) -> None:
    global _unpadded_told
    if _unpadded_told:
        return
    ids = kwargs.get("input_ids", args[0] if args else None)
    embeds = kwargs.get("inputs_embeds")
    if isinstance(ids, torch.Tensor) and ids.dim() == 2:
        length = ids.shape[1]
    elif isinstance(embeds, torch.Tensor) and embeds.dim() == 3:
        length = embeds.shape[1]
    else:
        return
    with _unpadded_lock:
        _unpadded.add(length)
        if len(_unpadded) <= UNPADDED_LENGTHS or _unpadded_told:
            return
        _unpadded_told = True
    logger.info("ltc_cache buckets: %s met %d sequence lengths it does not pad, each a program "
                "of its own (the last not padded for: %s); docs/serving.md#what-is-padded "
                "lists the calls that are", type(module).__name__, len(_unpadded), reason)


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
    if not isinstance(plan, tuple):
        if plan is not None:
            _note_unpadded(module, args, kwargs, plan)
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
                              "past_key_values", "cache"})


def _generate_padding(buckets: Buckets | None, module: Any, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> tuple[int, int, dict[str, Any]] | str | None:
    """How to pad the call: its rows, the padding to strip from the
    answer, the padded arguments; else why not (None: nothing to pad)."""
    if buckets is None:
        return None
    if len(args) > 1 or (args and "input_ids" in kwargs):
        return "positional arguments"
    ids = args[0] if args else kwargs.get("input_ids")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype != torch.long:
        return "a prompt that is not input_ids"
    extras = sorted(name for name in _GENERATE_EXTRAS
                    if kwargs.get(name) is not None and kwargs[name] is not False)
    if extras:
        return ", ".join(extras)
    mask = kwargs.get("attention_mask")
    if mask is None:
        mask = torch.ones_like(ids)
    elif not isinstance(mask, torch.Tensor) or mask.shape != ids.shape:
        return "an attention mask not shaped as the input_ids"
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
