"""Every use the backend makes of AOTAutograd's private surface.

The backend compiles through AOTAutograd (``aot_autograd`` of
``torch._dynamo.backends.common``, ``make_boxed_func``, the switch in
``torch._functorch.config`` that compiles a backward with its forward),
reads the metadata it leaves in Dynamo's tracing context
(``torch._guards.TracingContext``: what a plan may hold, :mod:`.plan` and
:mod:`.joint`), makes a tracing context of its own for a graph compiled on
its first call, and leaves AOTAutograd's fake-tensor mode where it needs
real tensors. All of it is torch-private. This module is the one place in
the package that touches ``torch._functorch``, ``functorch``,
``torch._guards``, ``torch._dynamo.backends.common`` and
``torch.compiler._compile_session_context``, and the one that touches fake
tensors (``torch._subclasses``, the dispatch keys a fake tensor is made
with) and dispatch modes: ``program/`` makes its fake tensors here too
(``tests/common/test_layers.py`` holds every other module to that), so
that a torch upgrade that moves them breaks here, and
``tests/common/test_torch_private.py`` (its AOTAutograd section) is where
it breaks first, by name.

Written against torch 2.13. AOTAutograd is imported by the functions that
need it: a warm start that runs stored plans never loads it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

__all__ = ["aot_compiler", "backward_compiled_with_forward", "boxed_function",
           "compile_session", "fake_mode", "fake_tensor_maker", "forward_metadata", "is_fake",
           "real_tensors", "run_time_tracing"]


def aot_compiler(*, forward: Callable[..., Any], backward: Callable[..., Any],
                 inference: Callable[..., Any],
                 decompositions: Mapping[Any, Callable[..., Any]]) -> Callable[..., Any]:
    """A Dynamo backend that runs AOTAutograd with these graph compilers
    and ``decompositions``. An input the graph updates (a static key/value
    cache's ``index_copy_``) is written by the graph's own ``copy_``, an
    eager op a plan holds, not by AOTAutograd's runtime wrapper."""
    from torch._dynamo.backends.common import aot_autograd

    return aot_autograd(fw_compiler=forward, bw_compiler=backward,
                        inference_compiler=inference, decompositions=decompositions,
                        keep_inference_input_mutations=True)


def boxed_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as a graph compiler returns it: called with one list of
    inputs, which it may free as it goes."""
    from functorch.compile import make_boxed_func

    return make_boxed_func(fn)


def forward_metadata() -> Any | None:
    """AOTAutograd's ``ViewAndMutationMeta`` of the graph being compiled
    (what its runtime wrapper does around the graph), from the tracing
    context; None outside one."""
    from torch._guards import TracingContext

    context = TracingContext.try_get()
    return context.fw_metadata if context is not None else None


def run_time_tracing() -> contextlib.AbstractContextManager[Any]:
    """What Dynamo gives a backend, for one compiling at run time (on a
    graph's first real call, outside Dynamo): a tracing context with a fake
    mode of its own, where AOTAutograd leaves the metadata a plan is made
    from (static shapes: the graph is compiled for one input layout)."""
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode

    return tracing(TracingContext(FakeTensorMode()))


def backward_compiled_with_forward(wanted: bool) -> contextlib.AbstractContextManager[Any]:
    """AOTAutograd compiles a backward graph on its first backward call, so a
    graph whose outputs get no gradient in the cold process (one of
    Longformer's) stored no training plan, and every warm start ran
    AOTAutograd for it. Its private switch compiles the backward with the
    forward, and so stores the plan, whatever the step's backward reaches
    (docs/torch/aot-autograd.md#backward-compiled-on-first-backward)."""
    from torch._functorch import config

    if not wanted or not hasattr(config, "force_non_lazy_backward_lowering"):
        return contextlib.nullcontext()
    return config.patch(force_non_lazy_backward_lowering=True)


def compile_session() -> contextlib.AbstractContextManager[Any]:
    """AOTAutograd traces with FX, which flags "FX is tracing" for the whole
    process (``torch.fx._symbolic_trace._is_fx_tracing_flag``). A
    ``torch.compile``'d function called meanwhile in another thread takes
    that for an FX trace of itself and raises ("Detected that you are using
    FX to symbolically trace a dynamo-optimized function"), unless Dynamo is
    compiling: Dynamo marks its compile sessions process-wide too, and calls
    the backend inside one. A graph compiled on its first call (a
    program's, a shape of a symbolic one) is traced outside Dynamo, so its
    trace is made a compile session of its own; inside Dynamo's, this
    changes nothing (docs/torch/dynamo.md#fx-tracing-flag-is-process-wide)."""
    return torch.compiler._compile_session_context()


def real_tensors() -> contextlib.AbstractContextManager[Any]:
    """Outside AOTAutograd's fake-tensor mode (and any other dispatch mode):
    tensors made inside are real
    (docs/torch/aot-autograd.md#lazy-tracing-fails-under-a-dispatch-mode)."""
    return _disable_current_modes()


def fake_mode(shape_env: Any = None) -> Any:
    """A fake-tensor mode of its own (with ``shape_env``, symbolic shapes)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(shape_env=shape_env)


def fake_tensor_maker() -> Callable[[torch.Tensor, torch.device, type, int], torch.Tensor]:
    """A function that makes a fake tensor of a meta tensor, its device,
    its Python type and its dispatch keys (as ``DispatchKeySet``'s raw
    number), as Dynamo's guard state unpickles one: every tensor it makes
    shares one fake mode (docs/torch/dynamo.md#three-load-costs-paid-elsewhere)."""
    from torch._subclasses.fake_tensor import FakeTensorConverter, FakeTensorMode

    mode, converter = FakeTensorMode(), FakeTensorConverter()

    def make(meta_tensor: torch.Tensor, device: torch.device, pytype: type,
             dispatch_keys_raw: int) -> torch.Tensor:
        return converter.from_meta_and_device(
            mode, meta_tensor, device, pytype,
            torch._C.DispatchKeySet.from_raw_repr(dispatch_keys_raw))

    return make


def is_fake(value: Any) -> bool:
    """Whether ``value`` is a fake tensor (AOTAutograd's compilers get them,
    docs/torch/aot-autograd.md#aot-compilers-see-fake-tensors)."""
    return isinstance(value, torch._subclasses.FakeTensor)
