"""``CompiledModule``: what :func:`ltc_cache.compile` returns for a module,
a stand-in that training loops take for the module itself.

Training loops look at the model they are given, not only call it:

- transformers' ``Trainer`` keeps the dataset columns named in
  ``inspect.signature(model.forward)`` and finds the label names in
  ``type(model).forward``'s signature;
- accelerate, transformers and Lightning recognise a compiled model as an
  instance of Dynamo's ``OptimizedModule`` and unwrap it through
  ``_orig_mod`` (``accelerate.utils.extract_model_from_parallel``), to save
  the plain model (``save_pretrained``) and not to compile it a second time;
  Lightning's ``Trainer.fit`` then wraps the module's methods with the
  wrapper's ``dynamo_ctx``;
- optimizers' parameter groups, checkpoint tools and ``get_submodule`` use
  the names of ``named_parameters``/``named_modules``/``state_dict``.

So a ``CompiledModule`` is an ``OptimizedModule`` (as ``torch.compile``'s
wrapper is), of a class made once per module class whose ``forward`` has
the module's signature and docstring; attribute reads and writes reach the
module (``config``, ``save_pretrained``, ``gradient_checkpointing_enable``);
and every name it shows is the module's own, with no ``_orig_mod.`` prefix
(``torch.compile``'s wrapper shows two sets of names: prefixed parameters,
unprefixed ``state_dict`` keys in transformers, prefixed in plain torch).
"""

from __future__ import annotations

import functools
import threading
import types
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from ..dynamo_package import OptimizedModule
from ..errors import UnpickledForward, Unreplaceable, WrongType
from ..threads import SharedPatch
from .buckets import Buckets, pad_forward, pad_generate

if TYPE_CHECKING:
    from .programs import Programs

__all__ = ["CompileAgain", "CompiledModule", "class_named_like", "forward_replaced",
           "fsdp_module_class", "stand_in"]

# ``ltc_cache.compile(model, **compile_kwargs)``, handed in by its module
# (:func:`ltc_cache.program.precompile.compile_again`), which imports this one.
CompileAgain = Callable[[Any, Mapping[str, Any]], Any]


class CompiledModule(OptimizedModule):
    """What :func:`ltc_cache.compile` returns for a module: called like it,
    computing through programs; everything else is the module's.

    - ``forward`` shows the module's signature and docstring (on the
      instance and on the class);
    - attributes and methods read (and attributes set) reach the module;
      ``training``, ``train()``/``eval()``, ``to()`` are the module's;
    - ``named_parameters``/``parameters``, ``named_buffers``/``buffers``,
      ``named_modules``/``modules``, ``get_submodule``/``get_parameter``/
      ``get_buffer``, ``state_dict``/``load_state_dict`` are the module's,
      under the module's names: a saved ``state_dict`` loads into the plain
      module and back;
    - it is an ``OptimizedModule`` whose ``_orig_mod`` is the module, which
      is how accelerate and transformers recognise a compiled model and
      unwrap it (saving the plain model, never compiling it again), and
      whose ``dynamo_ctx`` turns the module's forward into one computing
      through the programs (Lightning's ``Trainer.fit`` applies it);
    - ``copy.deepcopy`` and pickle compile a copy of the module.
    """

    # Dynamo's wrapper sets a flag around each call that only matters while
    # Dynamo traces hooks; a program runs outside Dynamo: the plain call.
    __call__ = torch.nn.Module.__call__

    def __init__(self, module: torch.nn.Module, programs: Programs,
                 buckets: Buckets | None = None,
                 compile_kwargs: Mapping[str, Any] | None = None,
                 compile_again: CompileAgain | None = None) -> None:
        # OptimizedModule.__init__ builds Dynamo's context; this sets what
        # its methods read (``_orig_mod`` first: attribute access goes
        # through it), as that does.
        object.__setattr__(self, "_orig_mod", module)
        object.__setattr__(self, "_super_module_initialized", False)
        torch.nn.Module.__init__(self)
        object.__setattr__(self, "_super_module_initialized", True)
        torch.nn.Module.__setattr__(self, "_orig_mod", module)  # a registered child
        self.__dict__["_ltc_programs"] = programs
        self.__dict__["_ltc_buckets"] = buckets
        self.__dict__["_ltc_compile_kwargs"] = dict(compile_kwargs or {})
        self.__dict__["_ltc_compile_again"] = compile_again
        own = module.__dict__.get("forward")
        if own is not None:  # a forward set on the instance (a hook, a patch)
            self.__dict__["forward"] = _forward_like(own, programs)
        self.__dict__["dynamo_ctx"] = _ProgramsContext(module, programs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return _through_programs(self, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return torch.nn.Module.__getattr__(self, name)
        except AttributeError:
            if name in ("_modules", "_orig_mod") or name.startswith("__"):
                raise  # half-built (copy, pickle): no module to ask
            return getattr(self._modules["_orig_mod"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "_orig_mod" and value is not self.__dict__["_modules"].get("_orig_mod"):
            # The programs compute with the module they were made for.
            raise Unreplaceable("ltc_cache.compile(module): its module cannot be replaced; "
                                 "compile the new module instead")
        if name == "__class__":  # fully_shard(stand-in) sets FSDP's class last
            refuse_sharding_the_stand_in(value)
        super().__setattr__(name, value)

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        # Pickled (and deep-copied) as "compile this module again".
        return (self.__dict__["_ltc_compile_again"],
                (self._orig_mod, self.__dict__["_ltc_compile_kwargs"]))

    # -- the module's names, never the wrapper's ---------------------------------

    def named_parameters(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, Any]]:
        return self._orig_mod.named_parameters(*args, **kwargs)

    def named_buffers(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, Any]]:
        return self._orig_mod.named_buffers(*args, **kwargs)

    def named_modules(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, Any]]:
        return self._orig_mod.named_modules(*args, **kwargs)

    def get_submodule(self, target: str) -> torch.nn.Module:
        return self._orig_mod.get_submodule(target)

    def get_parameter(self, target: str) -> torch.nn.Parameter:
        return self._orig_mod.get_parameter(target)

    def get_buffer(self, target: str) -> torch.Tensor:
        return self._orig_mod.get_buffer(target)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.load_state_dict(*args, **kwargs)

    def train(self, mode: bool = True) -> CompiledModule:
        self._orig_mod.train(mode)  # the module's own train(), where it has one
        return self

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """The model's own ``generate()`` (transformers), every forward it
        makes (the prompt's and each decoding step's) through this module's
        programs. As the module's attribute it would run eagerly. Threads
        may generate at once: the module's forward is the compiled one while
        any of them runs, and what it was before once the last one ends."""
        with self._generating().held():
            return pad_generate(self.__dict__["_ltc_buckets"], self._orig_mod, args, kwargs,
                                self._orig_mod.generate)

    def _generating(self) -> SharedPatch:
        patch = self.__dict__.get("_ltc_generating")
        if patch is None:
            with _generate_lock:  # one compiled forward (one set of programs) per module
                patch = self.__dict__.get("_ltc_generating")
                if patch is None:
                    # The module's forward method, compiled: its fallback calls
                    # the method, not the module, whose forward is this one
                    # meanwhile.
                    compile_again = self.__dict__.get("_ltc_compile_again")
                    module, programs = self._orig_mod, self.__dict__["_ltc_programs"]
                    forward = compile_again(types.MethodType(programs.fn, module),
                                            dict(programs.compile_kwargs, buckets=None))
                    patch = SharedPatch(lambda: forward_replaced(module, forward))
                    self.__dict__["_ltc_generating"] = patch
        return patch

    def __repr__(self) -> str:
        return f"ltc_cache.compile({self._orig_mod!r})"


# Held while a CompiledModule makes its generate() forward, once.
_generate_lock = threading.Lock()


def forward_replaced(module: torch.nn.Module, forward: Callable[..., Any]
                      ) -> Callable[[], None]:
    """Make ``module.forward`` ``forward`` (``Module.__call__`` reads the
    instance's attribute first; the programs call the class's function, so
    nothing recurses); returns what puts the old one back."""
    missing = object()
    before = module.__dict__.get("forward", missing)
    module.__dict__["forward"] = forward

    def restore() -> None:
        if before is missing:
            module.__dict__.pop("forward", None)
        else:
            module.__dict__["forward"] = before

    return restore


class _ProgramsContext:
    """What stands for Dynamo's context at ``dynamo_ctx``, where Lightning
    reads it: ``Trainer.fit(compiled)`` unwraps the LightningModule and
    wraps its ``forward`` and ``*_step`` methods with it. The forward
    computes through the programs; a step method stays as it is (its
    ``self(batch)`` reaches the programs through the wrapped forward, and
    the rest of it, the loss and logging, is eager code)."""

    def __init__(self, module: torch.nn.Module, programs: Programs) -> None:
        self._module = module
        self._programs = programs

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        if fn == self._module.forward:
            return _forward_like(fn, self._programs)
        return fn

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        # Saved with the module it is kept on (Lightning's _compiler_ctx),
        # as a placeholder: see _ProgramsForward.
        return (_saved_forward, ())


def _forward_like(original: Callable[..., Any], programs: Programs) -> _ProgramsForward:
    return _ProgramsForward(original, programs)


class _ProgramsForward:
    """A ``forward`` for an instance (unbound, as one in an instance's
    ``__dict__`` is called): computes through the programs, shows
    ``original``'s signature and docstring (``inspect.signature`` follows
    ``__wrapped__``). Dynamo saves a module's callables with the guards of a
    program made through it (Lightning's ``validate`` after ``fit``); this
    one pickles as a placeholder, not as the programs it holds."""

    def __init__(self, original: Callable[..., Any], programs: Programs) -> None:
        self._programs = programs
        functools.update_wrapper(self, original)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._programs(args, kwargs)

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return (_saved_forward, ())


def _saved_forward() -> Callable[..., Any]:
    def forward(*args: Any, **kwargs: Any) -> Any:
        raise UnpickledForward("a forward that ran through ltc_cache programs, unpickled: "
                           "compile the module again with ltc_cache.compile")

    return forward


@functools.cache
def _stand_in_class(cls: type[torch.nn.Module]) -> type[CompiledModule]:
    """The CompiledModule class for modules of class ``cls``: named like
    it (transformers reads ``type(model).__name__`` and
    ``type(model).forward``'s parameters for the label names), with a
    ``forward`` that shows ``cls.forward``'s signature and docstring."""
    return class_named_like(CompiledModule, cls, _through_programs)


_B = TypeVar("_B", bound=torch.nn.Module)


def class_named_like(base: type[_B], cls: type[torch.nn.Module],
                     call: Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]) -> type[_B]:
    """A subclass of ``base`` named like ``cls``, whose ``forward`` is
    ``call(self, args, kwargs)`` with ``cls.forward``'s signature and
    docstring."""

    def forward(self: _B, *args: Any, **kwargs: Any) -> Any:
        return call(self, args, kwargs)

    functools.update_wrapper(forward, cls.forward)  # inspect.signature follows __wrapped__
    return type(cls.__name__, (base,), {
        "forward": forward,
        "__module__": base.__module__,
        "__qualname__": f"{base.__name__}[{cls.__qualname__}]",
        "__doc__": base.__doc__,
    })


def _through_programs(compiled: CompiledModule, args: tuple[Any, ...],
                      kwargs: dict[str, Any]) -> Any:
    """A call of the stand-in: its module's forward through the programs,
    its sequence padded to a bucket where that is safe."""
    state = compiled.__dict__
    return pad_forward(state["_ltc_buckets"], state["_modules"]["_orig_mod"], args, kwargs,
                       state["_ltc_programs"])


def stand_in(module: torch.nn.Module, programs: Programs, buckets: Buckets | None,
             compile_kwargs: Mapping[str, Any], compile_again: CompileAgain) -> CompiledModule:
    """The CompiledModule of ``module``, computing through ``programs``
    (sequences padded to ``buckets``); ``compile_again(model, kwargs)`` is
    ``ltc_cache.compile(model, **kwargs)``, how the stand-in pickles (with
    ``compile_kwargs``) and compiles its module's forward for generate()."""
    return _stand_in_class(type(module))(module, programs, buckets, compile_kwargs,
                                         compile_again)


# -- FSDP2 (``fully_shard``), as the stand-in and fully_sharded.py read it -----


def fsdp_module_class() -> type | None:
    """FSDP2's module class, where this torch has one."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch built without distributed
        return None
    return FSDPModule


def refuse_sharding_the_stand_in(cls: type) -> None:
    """``fully_shard(ltc_cache.compile(model))`` made the stand-in an FSDP
    root whose first forward fails inside FSDP's hook
    (docs/torch/distributed.md#sharding-the-stand-in-fails): refused where ``fully_shard`` sets its
    class, its last step, with the order that works."""
    fsdp = fsdp_module_class()
    if fsdp is not None and isinstance(cls, type) and issubclass(cls, fsdp):
        raise WrongType(
            "fully_shard(ltc_cache.compile(model)) is not supported: FSDP2 must shard the "
            "model itself. Call fully_shard on the blocks and on the model first, then "
            "ltc_cache.compile(model) (docs/recipes.md, FSDP2)")
