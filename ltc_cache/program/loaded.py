"""One loaded program (its guards, the checks standing in for the ones Dynamo
cannot save, the transformed bytecode), and the cheap picture of a call's
arguments that picks the programs to try."""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..dynamo_package import program_guards
from ..errors import GrowingLayout
from .describe import OBJECT_DEPTH, plain_object
from .guards import Checks

if TYPE_CHECKING:
    from .route import Call


class LoadedProgram:
    """A program ready to run: its guards, the checks standing in for the
    ones Dynamo cannot save, and the transformed bytecode."""

    __slots__ = ("_checks", "_direct", "_fn", "_guards", "_live", "_snapshot", "artifact")

    def __init__(self, artifact: Any, checks: Checks, live_globals: dict[str, Any],
                 direct_globals: Sequence[str]) -> None:
        self.artifact = artifact
        self._fn = artifact.fn
        self._guards = program_guards(artifact)
        self._checks = checks
        self._live = live_globals
        # The bytecode and its guards read a copy of the module's globals
        # made at load; the ones the guards read are refreshed from the
        # module before each check, so rebinding one is seen.
        self._snapshot = artifact.fn.__globals__
        self._direct = tuple(name for name in direct_globals if name in live_globals)
        # Checks of builtins read them through the dict Dynamo names so.
        for name in checks.builtins_dicts:
            self._snapshot.setdefault(name, builtins.__dict__)

    def bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        return self.artifact.prepare_f_locals(*args, **kwargs)

    def _refresh(self) -> None:
        live, snapshot = self._live, self._snapshot
        for name in self._direct:
            if name in live:
                snapshot[name] = live[name]
            else:
                snapshot.pop(name, None)

    def resolve(self, f_locals: Mapping[str, Any]) -> str | None:
        """Why this program does not fit this call, or None."""
        self._refresh()
        if not self._guards.check(f_locals):
            failed = getattr(self._guards.check_verbose(f_locals), "verbose_code_parts", ())
            return f"a guard fails ({'; '.join(str(p) for p in list(failed)[:2])[:300]})"
        return self._checks.resolve(f_locals, self._snapshot)

    def compiled_checks(self) -> list[list[Any]]:
        """The code of the checks :meth:`resolve` compiled, marshalled."""
        return self._checks.compiled()

    def check(self, f_locals: Mapping[str, Any]) -> bool:
        if self._direct:
            self._refresh()
        fast = self._checks.fast
        return fast is not None and self._guards.check(f_locals) and fast(f_locals, self._snapshot)

    def fits(self, call: Call) -> bool:
        """Whether the guards and checks hold for ``call`` (once
        :meth:`resolve` has compiled the checks)."""
        return self.check(self.bind(call.full, call.kwargs))

    def run(self, call: Call) -> Any:
        return self._fn(*call.full, **call.kwargs)


def call_layout(value: Any, depth: int = 0) -> Any:
    """A cheap, hashable picture of an argument, to pick the programs to try."""
    if depth > OBJECT_DEPTH:  # (a cycle): the program key refuses it
        return (type(value), id(value))
    if isinstance(value, torch.Tensor):
        return (value.shape, value.dtype, value.device, value.requires_grad)
    if value is None or isinstance(value, bool | int | float | str):
        return (type(value), value)
    if isinstance(value, torch.dtype | torch.device | torch.memory_format | torch.layout):
        return (type(value), str(value))  # equal ones need not be the same object
    if isinstance(value, tuple | list):
        return (type(value), tuple(call_layout(v, depth + 1) for v in value))
    if isinstance(value, dict):
        return (type(value), tuple((k, call_layout(v, depth + 1)) for k, v in value.items()))
    if getattr(value, "is_compileable", True) is False:
        # transformers' DynamicCache: a new layout every decoding step.
        raise GrowingLayout(type(value).__name__)
    if plain_object(value):  # a StaticCache: the same layout every step
        return (type(value), tuple((k, call_layout(v, depth + 1)) for k, v in vars(value).items()))
    return (type(value), id(value))


