"""What is patched and recorded while Dynamo captures a program: the code it
traces (for the source records), the once-only logger methods it skips,
torch's shared constants in the saved guard state, and attributes that a
checkpointed block sets and restores."""

from __future__ import annotations

import contextlib
import logging
import types
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ..dynamo_package import SourceInfo, logging_functions_ignored, side_effect_pieces
from .describe import code_record
from .guards import state_pickler


@contextlib.contextmanager
def recording_traced_code(codes: list[types.CodeType]) -> Iterator[None]:
    """Collect the code objects Dynamo traced. aot_compile hands each to
    ``SourceInfo.add_code``, which reads the whole module's source into the
    artifact and skips code without a module; this records every one and
    stores nothing (the sources are recorded by :func:`code_record`)."""
    original = SourceInfo.add_code

    def add_code(self: Any, code: types.CodeType) -> None:
        codes.append(code)

    SourceInfo.add_code = add_code  # type: ignore[method-assign]
    try:
        yield
    finally:
        SourceInfo.add_code = original  # type: ignore[method-assign]


def once_logging() -> Any:
    """Dynamo's setting that makes it skip, while it captures a program,
    the logger methods that log a message once per process (transformers
    adds ``warning_once`` and ``info_once`` to ``logging.Logger``, and its
    models call them in ``forward``: a ``loss_type`` it does not know, a
    deprecated argument). Dynamo cannot trace a log call; each would be a
    graph break, keeping the model off programs for a message printed once.
    Inside a program they log nothing, in every process."""
    once = {value for name, value in vars(logging.Logger).items()
            if name.endswith("_once") and callable(value)}
    return logging_functions_ignored(once)


# Torch's own constants, one object each for the whole process.
_SHARED_CONSTANTS = (torch.dtype, torch.layout, torch.memory_format)


@contextlib.contextmanager
def shared_constants_saved() -> Iterator[None]:
    """Dynamo saves a module in the guards' state without the attributes
    no guard reads, marking each such value "missing" by identity; a module
    attribute holding one of torch's shared constants (LightningModule's
    ``_dtype`` is ``torch.float32``) then makes every use of that constant
    in the state missing, tensors' dtypes included, and the program fails
    to load (``empty_strided(): argument 'dtype' must be torch.dtype, not
    _Missing``). Those constants are kept: they pickle by name."""
    pickler = state_pickler()
    original = pickler.reducer_override

    def reducer_override(self: Any, obj: Any) -> Any:
        result = original(self, obj)
        if isinstance(obj, torch.nn.Module):
            for key in [k for k, v in self.missing_values.items()
                        if isinstance(v, _SHARED_CONSTANTS)]:
                del self.missing_values[key]
        return result

    pickler.reducer_override = reducer_override
    try:
        yield
    finally:
        pickler.reducer_override = original


def source_records(codes: Sequence[types.CodeType]) -> list[Any]:
    seen, records = set(), []
    for code in codes:
        record = code_record(code)
        if record is not None and tuple(record[:3]) not in seen:
            seen.add(tuple(record[:3]))
            records.append(record)
    return records


class _NotRestored:
    """What an attribute holds, for Dynamo's check that a higher-order op
    restored it, while a value that is no constant is stored there: equal
    to nothing, so the check fails unless a constant equal to the original
    is stored after it."""

    def __eq__(self, other: object) -> bool:
        return False

    def __ne__(self, other: object) -> bool:
        return True

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "a value that is not a constant"


_NOT_RESTORED = _NotRestored()
_DEFERRING = "_ltc_cache_deferring"  # on a SideEffects: depth of its deferred checks
_UNCHECKED = "_ltc_cache_unchecked"  # on a SideEffects: the object of the store under way


@contextlib.contextmanager
def restored_attributes_allowed() -> Iterator[None]:
    """Let a higher-order op's body (a checkpointed block) set an attribute
    of an object from outside it to any value, where the body sets it back
    to the constant it held before. Dynamo allows such a set-and-restore
    only where every value stored is a constant (``SideEffects.
    defer_side_effect_checks``: "context managers that flip-flop a flag
    produce no net side effect"); the ``kernels`` package's layer wrapper
    (transformers' Llama, Mistral, Qwen attention, where ``kernels`` is
    installed) stores a dictionary of functions in a context variable's
    ``global_var`` and puts back ``None``, so under activation checkpointing
    Dynamo refused the block as an "unsafe side effect" and the model fell
    apart into frames. Here such a store is deferred too, recorded as
    holding a value equal to nothing: Dynamo's own check at the end of the
    body passes only where a later store put back the original constant,
    else it refuses the block as before. Eager's checkpoint runs the block
    again in the backward; a restored attribute is the same after it
    (docs/torch/dynamo.md#checkpointed-block-may-restore-attributes)."""
    pieces = side_effect_pieces()
    if pieces is None:
        yield
        return
    side_effects_cls, existing, safe, autograd_ctx = pieces
    store_attr = side_effects_cls.store_attr
    check = side_effects_cls.check_allowed_side_effect
    defer = side_effects_cls.defer_side_effect_checks

    def deferred(self: Any, item: Any, name: str) -> bool:
        """Record ``item.name`` as changed from its constant value; False
        where it held no constant (then Dynamo decides, as before)."""
        key = (id(item), name)
        if key in self.deferred_attr_mutations:
            original = self.deferred_attr_mutations[key][0]
        else:
            output_graph = self.output_graph_weakref()
            if output_graph is None:
                return False
            try:
                held = item.var_getattr(output_graph.current_tx, name)
            except NotImplementedError:
                return False
            if not held.is_python_constant():
                return False
            original = held.as_python_constant()
        self.deferred_attr_mutations[key] = (original, _NOT_RESTORED)
        return True

    def patched_store(self: Any, item: Any, name: str, value: Any, *args: Any,
                      **kwargs: Any) -> Any:
        if (getattr(self, _DEFERRING, 0) > 0
                and isinstance(item.mutation_type, existing)
                and not safe(item.mutation_type)
                and not isinstance(item, autograd_ctx)
                and not self.should_allow_side_effects_in_hop()
                and not self.should_allow_externally_visible_side_effects_in_subtracer()
                and not value.is_python_constant()
                and deferred(self, item, name)):
            setattr(self, _UNCHECKED, item)
            try:
                return store_attr(self, item, name, value, *args, **kwargs)
            finally:
                setattr(self, _UNCHECKED, None)
        return store_attr(self, item, name, value, *args, **kwargs)

    def patched_check(self: Any, item: Any) -> Any:
        if item is getattr(self, _UNCHECKED, None):
            return True
        return check(self, item)

    @contextlib.contextmanager
    def patched_defer(self: Any) -> Iterator[None]:
        with defer(self):  # validates what was deferred, once the body is traced
            setattr(self, _DEFERRING, getattr(self, _DEFERRING, 0) + 1)
            try:
                yield
            finally:
                setattr(self, _DEFERRING, getattr(self, _DEFERRING) - 1)

    side_effects_cls.store_attr = patched_store
    side_effects_cls.check_allowed_side_effect = patched_check
    side_effects_cls.defer_side_effect_checks = patched_defer
    try:
        yield
    finally:
        side_effects_cls.store_attr = store_attr
        side_effects_cls.check_allowed_side_effect = check
        side_effects_cls.defer_side_effect_checks = defer
