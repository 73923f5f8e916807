"""What loading a program costs inside torch that it need not pay.

- torch's structured-trace handler (``TORCH_TRACE``) decides on its first
  record whether a trace is wanted and leaves when not; until it has, every
  ``trace_structured`` call renders its payload, and in a warm process the
  first one was Dynamo's text of the loaded guard manager.
- Dynamo unpickles each tensor its guards describe with a fake mode of its
  own, and a fake mode records the Python stack where it is made: forty
  walks of a stack sixty frames deep for ViT's forty parameters.

Both are in docs/torch/dynamo.md#three-load-costs-paid-elsewhere; the private piece the second
relies on comes through :mod:`.guards` (:func:`~.guards.state_pickler`), its
fake tensors through :mod:`ltc_cache.compile_backend.aot_autograd`, torch's
structured trace through :mod:`ltc_cache.dynamo_package`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from ..compile_backend.aot_autograd import fake_tensor_maker
from ..dynamo_package import trace_artifact
from .guards import state_pickler


@contextlib.contextmanager
def loading(name: str) -> Iterator[None]:
    """Around unpickling a program of ``name`` (its guard state, guard
    manager and graphs): both costs above avoided."""
    settle_trace_log(name)
    with one_fake_mode():
        yield


def settle_trace_log(name: str) -> None:
    """Record in torch's structured trace that a program of ``name`` is
    being loaded: the handler's first record, made cheap."""
    trace_artifact("ltc_cache_program_load", name)


@contextlib.contextmanager
def one_fake_mode() -> Iterator[None]:
    """While a guard state is unpickled, its tensors share one fake mode
    (they are read for their metadata only: size, stride, dtype, device,
    dispatch keys). Where this torch unpickles them otherwise, nothing
    changes."""
    pickler = state_pickler()
    original = pickler.__dict__.get("_unpickle_tensor")
    if not isinstance(original, classmethod):
        yield
        return
    make = fake_tensor_maker()

    def unpickle_tensor(cls: type, meta_tensor: torch.Tensor, device: torch.device,
                        pytype: type, dispatch_keys_raw: int, grad: Any) -> torch.Tensor:
        tensor = make(meta_tensor, device, pytype, dispatch_keys_raw)
        tensor.grad = grad
        return tensor

    pickler._unpickle_tensor = classmethod(unpickle_tensor)
    try:
        yield
    finally:
        pickler._unpickle_tensor = original
