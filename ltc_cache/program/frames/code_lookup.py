"""Where a later process finds a code object again, for a program of several
frames: the codes Dynamo ran as they are (recorded by module and name,
handed back to the eval-frame hook at load), property getters the package
cannot name, and Dynamo's name counter, kept past the names a loaded
package installed.

Finding a code imports no module: a code that is not where it was recorded
is left alone.
"""

from __future__ import annotations

import inspect
import re
import sys
import types
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ...dynamo_package import run_as_is, unique_ids_from

__all__ = ["advance_unique_ids", "apply_skips", "find_code", "property_source", "skip_record"]

# Names Dynamo numbers from its process-wide unique-id counter.
_NUMBERED = re.compile(r"^__(?:resume_at_\d+|builtins_dict__)_(\d+)$")


def skip_record(code: types.CodeType, f_globals: Mapping[str, Any],
                 recursive: int) -> list[Any] | None:
    """``[module, path, qualname, first line, recursive action]``: where a
    later process finds ``code`` (``module``'s attribute ``path``, or
    through it), or None where it cannot be named."""
    module = f_globals.get("__name__")
    if not isinstance(module, str) or getattr(sys.modules.get(module), "__dict__", None) \
            is not f_globals:
        # A module that names itself otherwise (_collections_abc is
        # "collections.abc"): by the name it is imported under.
        module = next((name for name, m in list(sys.modules.items())
                       if getattr(m, "__dict__", None) is f_globals), None)
        if module is None:
            return None
    record = [module, "", code.co_qualname, code.co_firstlineno, recursive]
    for path in _paths(sys.modules[module], code.co_qualname):
        record[1] = path
        if find_code(record) is code:
            return record
    return None


def _paths(module: types.ModuleType, qualname: str) -> Iterator[str]:
    """Where to look for a code: its qualname, then each module global and
    each attribute of a module-level class (a lambda bound to a global, a
    decorator's wrapper)."""
    yield qualname
    if ".<locals>." in qualname:  # a nested function or generator: through its parent
        yield qualname.partition(".<locals>.")[0]
    for name, value in list(vars(module).items()):
        yield name
        if isinstance(value, type) and value.__module__ == module.__name__:
            for attribute in list(vars(value)):
                yield f"{name}.{attribute}"


def find_code(record: Sequence[Any]) -> types.CodeType | None:
    """The code a skip record names, in this process, importing nothing."""
    module_name, path, qualname, first_line_no = record[:4]
    obj: Any = sys.modules.get(str(module_name))
    for part in str(path).split("."):
        if obj is None or part == "<locals>":
            return None
        obj = inspect.getattr_static(obj, part, None)
    # The object, a property's getter, a static or class method's function,
    # what functools.wraps wrapped.
    for candidate in (obj, getattr(obj, "fget", None), getattr(obj, "__func__", None),
                      getattr(obj, "__wrapped__", None)):
        code = getattr(candidate, "__code__", None)
        found = _nested(code, str(qualname), first_line_no) \
            if isinstance(code, types.CodeType) else None
        if found is not None:
            return found
    return None


def _nested(code: types.CodeType, qualname: str, first_line_no: Any) -> types.CodeType | None:
    """``code`` or a code defined inside it with this qualname and line."""
    if code.co_qualname == qualname and code.co_firstlineno == first_line_no:
        return code
    if not qualname.startswith(code.co_qualname + ".<locals>."):
        return None
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found = _nested(const, qualname, first_line_no)
            if found is not None:
                return found
    return None


def apply_skips(records: Sequence[Any]) -> None:
    """Tell the eval-frame hook to run these codes as they are, as it was
    told in the process that captured the program (a code that is not the
    same here, or not there, is left alone)."""
    for record in records:
        if not isinstance(record, list) or len(record) != 5:
            continue
        code = find_code(record)
        if code is not None:
            run_as_is(code, int(record[4]))


def property_source(code: types.CodeType) -> tuple[str, str, str] | None:
    """``(module, qualname, "fget.__code__")`` where ``code`` is a property's
    getter (setter, deleter) reached by its qualname from its module: what
    ``torch._dynamo.package._lookup_code`` resolves in a later process."""
    module = inspect.getmodule(code)
    if module is None:
        return None
    owner: Any = module
    for part in code.co_qualname.split("."):
        owner = getattr(owner, part, None)
        if owner is None:
            return None
    if not isinstance(owner, property):
        return None
    for accessor in ("fget", "fset", "fdel"):
        function = getattr(owner, accessor)
        if getattr(function, "__code__", None) is code:
            return module.__name__, code.co_qualname, f"{accessor}.__code__"
    return None


def advance_unique_ids(f_globals: Mapping[str, Any]) -> None:
    """Move Dynamo's name counter past every numbered name in ``f_globals``
    (those a package installed), so later captures pick fresh ones."""
    top = max((int(m.group(1)) for name in f_globals
               if (m := _NUMBERED.match(name))), default=-1)
    unique_ids_from(top + 1)
