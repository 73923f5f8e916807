"""What is patched and recorded while Dynamo captures a program: the code it
traces (for the source records), the once-only logger methods it skips, and
torch's shared constants in the saved guard state."""

from __future__ import annotations

import contextlib
import logging
import types
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from .describe import code_record


@contextlib.contextmanager
def recording_traced_code(codes: list[types.CodeType]) -> Iterator[None]:
    """Collect the code objects Dynamo traced. aot_compile hands each to
    ``SourceInfo.add_code``, which reads the whole module's source into the
    artifact and skips code without a module; this records every one and
    stores nothing (the sources are recorded by :func:`code_record`)."""
    from torch._dynamo.package import SourceInfo

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
    config = torch._dynamo.config
    return config.patch(ignore_logging_functions=set(config.ignore_logging_functions) | once)


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
    from torch._dynamo.guards import GuardsStatePickler

    original = GuardsStatePickler.reducer_override

    def reducer_override(self: Any, obj: Any) -> Any:
        result = original(self, obj)
        if isinstance(obj, torch.nn.Module):
            for key in [k for k, v in self.missing_values.items()
                        if isinstance(v, _SHARED_CONSTANTS)]:
                del self.missing_values[key]
        return result

    GuardsStatePickler.reducer_override = reducer_override  # type: ignore[method-assign]
    try:
        yield
    finally:
        GuardsStatePickler.reducer_override = original  # type: ignore[method-assign]


def source_records(codes: Sequence[types.CodeType]) -> list[Any]:
    seen, records = set(), []
    for code in codes:
        record = code_record(code)
        if record is not None and tuple(record[:3]) not in seen:
            seen.add(tuple(record[:3]))
            records.append(record)
    return records
