"""The ``CompilePackage`` under a program of frames: it records, for each frame
Dynamo compiles, the portable checks its guard filter made and the sources
Dynamo traced, names frames the package cannot (a property's getter), and
leaves out of the package a frame it cannot save (that frame alone is
captured again in a later process). Every piece of torch it uses is in
:mod:`ltc_cache.dynamo_package`."""

from __future__ import annotations

import contextlib
import inspect
import sys
import types
from collections.abc import Iterator
from typing import Any

from ...dynamo_package import CompilePackage, PackageError, bypassed_entry
from ...errors import Unportable
from ..describe import code_record
from .code_lookup import property_source

__all__ = ["FramePackage"]


class FramePackage(CompilePackage):
    """A CompilePackage that records, for each frame it is given, the
    portable checks its guard filter made, and the sources Dynamo
    traced as code records (not the module texts)."""

    def __init__(self, fn: Any, dynamo: Any = None, guard_filter: Any = None) -> None:
        self.ltc_filter = guard_filter
        self.ltc_frames: list[tuple[types.CodeType, types.CodeType, list[Any]]] = []
        self.ltc_sources: list[Any] = []
        self.ltc_unportable: str | None = None
        self.ltc_left_out: list[str] = []  # frames not in the package (their names)
        self.ltc_installed: dict[str, Any] = {}  # globals Dynamo installed, by name
        self.ltc_skips: list[list[Any]] = []  # codes Dynamo runs as they are
        # Every frame compiled here with its checks, stored or not: the
        # filter dropped its identity guards, so its live entry gets
        # the checks in their place (FramesProgram._check_new_frames).
        self.ltc_live: list[tuple[types.CodeType, types.CodeType, list[Any]]] = []
        self.ltc_code: types.CodeType | None = None
        super().__init__(fn, dynamo, ignore_inlined_sources=True)

    # -- what the package holds, in its order (the order frames were recorded in)

    def codes(self) -> list[types.CodeType]:
        """The original codes of the package's frames."""
        return list(self._codes)

    def guarded_count(self, code: types.CodeType) -> int:
        """How many compiled frames the package holds for ``code``."""
        return len(self._codes[code].guarded_codes)

    def installed_modules(self) -> list[types.ModuleType]:
        """The modules an installed package put names in."""
        return list(self._installed_globals)

    # -- CompilePackage's hooks --------------------------------------------------

    def code_context(self, code: types.CodeType) -> Any:
        # Dynamo compiles a frame of its own for user code it does not
        # inline; the package names it by its module and qualname, which
        # fails for some (a property's getter): those are named here, and
        # a frame that cannot be named is left out of the package (a
        # later process captures that frame alone) instead of failing
        # the capture.
        self.ltc_code = code
        if code not in self._codes and not self._located(code):
            return self._left_out(code)
        return super().code_context(code)

    def _located(self, code: types.CodeType) -> bool:
        try:
            self._add_user_function(code)
            return True
        except PackageError:
            pass
        found = property_source(code)
        if found is None:
            return False
        module, function_name, code_source = found
        self._add_function(code, module, function_name=function_name,
                           code_source=code_source)
        return True

    @contextlib.contextmanager
    def _left_out(self, code: types.CodeType) -> Iterator[None]:
        self.ltc_left_out.append(code.co_qualname)
        if self._current_entry is not None:
            raise AssertionError("_current_entry is already set in code_context")
        self._current_entry = bypassed_entry(
            code, getattr(inspect.getmodule(code), "__name__", "?"))
        try:
            yield
        finally:
            self._current_entry = None

    def add_guarded_code(self, guards_state: bytes, dynamo_code: types.CodeType) -> None:
        entry = self._current_entry
        flt = self.ltc_filter
        checks = list(flt.checks) if flt is not None else []
        if self.ltc_code is not None:
            self.ltc_live.append((self.ltc_code, dynamo_code, checks))
        super().add_guarded_code(guards_state, dynamo_code)
        if entry is None or entry.bypassed:
            return
        code = next(c for c, e in self._codes.items() if e is entry)
        why = self._globals_saved(entry, dynamo_code)
        if why is not None:  # this frame alone is captured again in a later process
            entry.guarded_codes.pop()
            self.ltc_left_out.append(f"{code.co_qualname} ({why})")
            return
        if flt is not None and flt.unportable:
            self.ltc_unportable = self.ltc_unportable or flt.unportable
        self.ltc_frames.append((code, dynamo_code, checks))

    def _globals_saved(self, entry: Any, dynamo_code: types.CodeType) -> str | None:
        """Globals the frame's bytecode reads that Dynamo installed for
        it (a module it reconstructs, a helper) are not in the package:
        modules are added as its imports; anything else leaves the frame
        out (None where all are saved)."""
        for name in _global_names(dynamo_code):
            value = self.ltc_installed.get(name, _MISSING)
            if value is _MISSING or name.startswith(_PACKAGED):
                continue
            if isinstance(value, types.ModuleType) and \
                    sys.modules.get(value.__name__) is value:
                entry.import_sources[name] = value.__name__
                continue
            return f"reads {name}, a {type(value).__name__} Dynamo installed"
        return None

    def add_inlined_source(self, sources: list[types.CodeType]) -> None:
        for code in sources:
            if code in self._resume_codes:
                continue
            try:
                record = code_record(code)
            except Unportable as exc:
                self.ltc_unportable = self.ltc_unportable or str(exc)
                continue
            if record is not None and record not in self.ltc_sources:
                self.ltc_sources.append(record)


_MISSING = object()


# Globals CompilePackage saves and installs itself.
_PACKAGED = ("__compiled_fn_", "__resume_at_", "__builtins_dict__")


def _global_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _global_names(const)
