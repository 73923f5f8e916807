"""A training call handed transformers' ``DynamicCache`` with nothing in
the layers it writes: the call runs its program with :class:`FreshLayers`
in the cache's place, and what the program wrote is put in the cache after.

Under ``use_cache`` (the default of most transformers configs, in training
too) a model builds a new ``DynamicCache`` on every forward and hands it to
each block, which appends its layer's keys and values. A ``DynamicCache``
grows every decoding step, so a call that takes one runs through
``torch.compile`` (:class:`~ltc_cache.program.loaded.GrowingLayout`), and
FSDP2's units are such calls: each block of a sharded GPT-2 was captured by
Dynamo in every process, warm ranks included (2 frames a rank). In a
training forward a block only ever meets its own layer empty: what it
attends to is the keys and values it has just computed, which is what an
empty layer's ``update`` returns. So where every layer the call's module
writes (its attention modules' ``layer_idx``) is empty, the program is
called with a :class:`FreshLayers` (a plain object whose layout is the same
every call), whose ``update`` records the keys and values and returns them;
the cache then gets them through its own ``update``, as the block would
have given them. Anything else (a layer holding keys, a layer kind other
than ``DynamicLayer``, a call under ``no_grad``: decoding) runs as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..diagnostics import warn_once

__all__ = ["FreshLayers", "with_fresh_layers"]


class FreshLayers:
    """Stands in for a ``DynamicCache`` whose layers a call writes are empty."""

    def __init__(self) -> None:
        self.written: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        # An empty DynamicLayer's update: these keys and values, stored.
        self.written[layer_idx] = (key_states, value_states)
        return key_states, value_states


def _fresh_cache_layers(value: Any) -> list[Any] | None:
    """The layers of ``value`` where it is a transformers ``DynamicCache``
    of plain ``DynamicLayer``s; None otherwise."""
    if getattr(value, "is_compileable", True) is not False or not callable(
            getattr(value, "update", None)):
        return None
    layers = getattr(value, "layers", None)
    if not isinstance(layers, list) or not all(
            type(layer).__name__ == "DynamicLayer"
            and type(layer).__module__ == "transformers.cache_utils"
            and isinstance(getattr(layer, "is_initialized", None), bool) for layer in layers):
        return None
    return layers


def _written_layers(owner: Any) -> set[int]:
    """The cache layers the modules under ``owner`` write (their attention
    modules' ``layer_idx``)."""
    if not isinstance(owner, torch.nn.Module):
        return set()
    return {m.layer_idx for m in owner.modules() if isinstance(getattr(m, "layer_idx", None), int)}


def with_fresh_layers(owner: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                      run: Callable[[tuple[Any, ...], dict[str, Any]], Any],
                      again: Callable[[tuple[Any, ...], dict[str, Any]], Any]) -> Any:
    """``run(args, kwargs)`` with the one ``DynamicCache`` among them
    replaced by a :class:`FreshLayers`, the keys and values it recorded
    then put in the cache; ``again(args, kwargs)`` (the call as it is)
    where that does not hold, or returns a picture of a result the
    stand-in would change. The cache must be a top-level argument."""
    if not torch.is_grad_enabled():
        return again(args, kwargs)
    found = [(i, None, held) for i, a in enumerate(args)
             if (held := _fresh_cache_layers(a)) is not None]
    found += [(None, k, held) for k, v in kwargs.items()
              if (held := _fresh_cache_layers(v)) is not None]
    layers = _written_layers(owner)
    if len(found) != 1 or not layers:
        return again(args, kwargs)
    index, name, held = found[0]
    cache = args[index] if index is not None else kwargs[name]
    if any(i < len(held) and held[i].is_initialized for i in layers):
        return again(args, kwargs)
    stand_in = FreshLayers()
    new_args = args if index is None else (*args[:index], stand_in, *args[index + 1:])
    new_kwargs = kwargs if name is None else {**kwargs, name: stand_in}
    try:
        out = run(new_args, new_kwargs)
    except Exception as exc:  # the block reads more of the cache than update(), say
        warn_once("fresh-layers-failed", "ltc_cache.compile: a call given a DynamicCache "
                  f"failed without it ({type(exc).__name__}); it runs through torch.compile")
        return again(args, kwargs)
    written = stand_in.written
    if not set(written) <= layers or _holds(out, stand_in):
        # Not what a block does: the result may differ from eager's; run it as it is.
        warn_once("fresh-layers", "ltc_cache.compile: a call given a DynamicCache wrote other "
                  "layers than its modules' or returned the cache; it runs through "
                  "torch.compile")
        return again(args, kwargs)
    for layer_idx in sorted(written):
        cache.update(*written[layer_idx], layer_idx)
    return out


def _holds(out: Any, stand_in: FreshLayers) -> bool:
    """Whether ``out`` (a tensor, a tuple or list, a dict or model output)
    holds ``stand_in`` at its top level."""
    if out is stand_in:
        return True
    values = out.values() if isinstance(out, dict) else out if isinstance(out, tuple | list) \
        else ()
    return any(v is stand_in for v in values)
