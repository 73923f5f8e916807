"""``torch.compile(..., backend="ltc_cache")`` of a transformers model, or of
its forward, called into transformers' static cache: served by the programs
and prompt buckets of :func:`ltc_cache.compile`, with no Dynamo capture.

transformers' static-cache guide compiles for ``generate()`` as
``model.forward = torch.compile(model.forward, ...)``; a server calls the
compiled module itself. Through Dynamo, each new prompt length is a capture
and LTC traces in every process (3-5 s for a small GPT-2 on a warm cache),
where ``model.forward = ltc_cache.compile(model.forward)`` pads the prompt's
forward to its bucket and loads the bucket's program. So, before Dynamo
captures the frame of such a call (:func:`ltc_cache.dynamo_package.serve_frames`),
the frame is handed over:

- ``torch.compile(model.forward, backend="ltc_cache")``: the frame is the
  model class's forward; its calls go through
  ``ltc_cache.compile(model.forward)`` (bound to the called instance);
- ``torch.compile(model, backend="ltc_cache")``: the frame is
  ``Module._wrapped_call_impl`` of the model; its calls go through
  ``ltc_cache.compile(model)``.

Taken are the calls of a transformers model (a ``PreTrainedModel``) with
keyword arguments whose key/value cache is transformers' static one: the
prompt's forward (padded where :mod:`.buckets` says it is exact) and each
decoding step. Every other call (a dynamic cache, no cache, training, a
positional input) is Dynamo's, as before; so is a call made while a served
one runs (the programs' own fall back to ``torch.compile``). Anything that
goes wrong before the programs run leaves the model to Dynamo from then on,
with one warning; its call runs eagerly once.
"""

from __future__ import annotations

import logging
import threading
import types
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..compile_backend.backend import LtcBackend, backend
from ..diagnostics import warn_once
from ..dynamo_package import module_call, module_call_code, serve_frames
from ..errors import first_line
from .buckets import into_static_cache, is_transformers_model
from .guards import checked_by

__all__ = ["backend", "serve"]

logger = logging.getLogger("ltc_cache.dynamo")

# What the frames of each model are served by: model -> {spelling: callable}.
_compiled: weakref.WeakKeyDictionary[torch.nn.Module, dict[str, Callable[..., Any]]] = (
    weakref.WeakKeyDictionary())
# Models whose compile failed: left to Dynamo.
_refused: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
_lock = threading.Lock()
_serving = threading.local()  # how deep this thread is in served calls


def serve(code: types.CodeType, f_locals: Mapping[str, Any]
          ) -> tuple[Callable[..., Any], Any] | None:
    """The server :func:`ltc_cache.dynamo_package.serve_frames` asks about a
    frame (its code takes ``self, *args, **kwargs``): None where it is not a
    served call, else what serves it and the guard manager that checks
    each call is one."""
    me, _, kw = code.co_varnames[:3]
    spelling = _spelling(code, f_locals.get(me))
    if spelling is None:
        return None

    def taken(f_locals: Mapping[str, Any]) -> bool:
        if getattr(_serving, "depth", 0):
            return False
        module, kwargs = f_locals.get(me), f_locals.get(kw)
        return (_spelling(code, module) == spelling and isinstance(kwargs, dict)
                and into_static_cache(kwargs))

    if not taken(f_locals):
        return None

    def call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        module, rest = args[0], args[1:]
        try:
            compiled = _compiled_for(module, spelling)
        except Exception as exc:
            _refused.add(module)
            logger.debug("%s: not served", type(module).__name__, exc_info=True)
            warn_once(f"served:{type(module).__name__}", f"torch.compile(backend=\"ltc_cache\") "
                      f"of {type(module).__name__}: its calls cannot go through ltc_cache's "
                      f"programs ({type(exc).__name__}: {first_line(exc)}); Dynamo compiles "
                      "them (this one runs eagerly)")
            eager = module_call if spelling == "module" else type(module).forward
            return eager(module, *rest, **kwargs)
        _serving.depth = getattr(_serving, "depth", 0) + 1
        try:
            return compiled(*rest, **kwargs)
        finally:
            _serving.depth -= 1

    return call, checked_by(taken, f"ltc_cache serves {code.co_name}: a transformers model "
                                   "called into a static key/value cache")


def _spelling(code: types.CodeType, module: Any) -> str | None:
    """``"forward"`` where ``code`` is the forward of ``module``'s class,
    ``"module"`` where it is a module's call; for a transformers model that
    no compile has refused, else None."""
    if not isinstance(module, torch.nn.Module) or not is_transformers_model(module) \
            or module in _refused:
        return None
    if code is module_call_code():
        return "module"
    forward = getattr(type(module), "forward", None)
    if getattr(forward, "__code__", None) is code:
        return "forward"
    return None


def _compiled_for(module: torch.nn.Module, spelling: str) -> Callable[..., Any]:
    """``ltc_cache.compile`` of ``module`` (``"module"``) or of its class's
    forward bound to it (``"forward"``), made once per model."""
    from .precompile import compile as ltc_compile

    with _lock:
        made = _compiled.setdefault(module, {})
        compiled = made.get(spelling)
        if compiled is None:
            target = module if spelling == "module" else \
                types.MethodType(type(module).forward, module)
            compiled = made[spelling] = ltc_compile(target)
    return compiled


def _serve_the_backends_frames() -> None:
    """Have :func:`serve` asked about the frames of ``torch.compile(backend=
    "ltc_cache")`` before Dynamo captures them (a process's first frame comes
    before any graph). torch.compile finds the "ltc_cache" backend in this
    module (the package's entry point, and ``ltc_cache.backend``), so its
    import is what does it."""
    try:
        serve_frames(lambda fn: isinstance(fn, LtcBackend) and fn.from_dynamo, serve)
    except Exception:  # a torch without the pieces: Dynamo captures, as before
        logger.debug("the programs serve no frame of the backend", exc_info=True)


_serve_the_backends_frames()
