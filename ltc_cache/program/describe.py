"""What an object is, described so that the description is equal in another
process exactly when the object is the same there (classes and functions by
name and code, constants by value), and the source records of the functions
Dynamo inlined, compared with the files on load."""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import inspect
import linecache
import os
import sys
import time
import types
from collections.abc import Sequence
from typing import Any

import torch

from ..entries.keys import code_digest
from ..errors import Unportable
from ..fx_ops import OpOverload, OpOverloadPacket

# How deep a function's closure and defaults are described.
_DEPTH = 12


# How deep an argument's containers and objects are described (a
# StaticCache: the cache, its list of layers, each layer, its tensors).
OBJECT_DEPTH = 8


def plain_object(value: Any) -> bool:
    """An object described by its class and its attributes (a transformers
    ``StaticCache`` and its layers: tensors, numbers, lists): not a module,
    a function, a class, nor anything else whose identity matters."""
    return (hasattr(value, "__dict__") and type(value).__module__ != "builtins"
            and not isinstance(value, torch.nn.Module | types.ModuleType | type
                               | types.FunctionType | types.MethodType))


def code_record(code: types.CodeType) -> list[Any] | None:
    """What is compared on load for one function Dynamo inlined:
    ``[file, first line, last line (exclusive), sha256 of the lines,
    qualname]``. None for code the key covers already (the interpreter's
    frozen modules, dataclass-generated methods whose class is checked);
    raises :class:`Unportable` for code with no source to compare."""
    filename = code.co_filename
    if filename.startswith("<frozen "):  # the standard library: the Python version
        return None
    if filename == "<string>" and code.co_qualname.startswith("__create_fn__.<locals>."):
        return None  # a dataclass's generated method: its class is described
    try:
        lines, first = inspect.getsourcelines(code)
    except (OSError, TypeError) as exc:
        raise Unportable(f"no source for {code.co_qualname} in {filename} ({exc})") from None
    if not lines or first < 1:
        raise Unportable(f"no source for {code.co_qualname} in {filename}")
    last = first + len(lines)
    return [filename, first, last, _digest_lines(lines), code.co_qualname]


def _digest_lines(lines: Sequence[str]) -> str:
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def changed_source(records: Sequence[Any], stats: Sequence[Any] = ()) -> str | None:
    """The first recorded source that is not what the files now say (a
    reason, for the log), or None when all are the same. ``stats``
    (:func:`source_stats`): files whose size, times and inode are still the
    ones the records were checked against are not read again."""
    unchanged = _unchanged_files(stats)
    for filename in {record[0] for record in records if isinstance(record, list | tuple)
                     and record and isinstance(record[0], str)} - unchanged:
        # linecache trusts size and mtime too: read what the disk holds.
        linecache.cache.pop(filename, None)
    for record in records:
        try:
            filename, first, last, digest, qualname = record
        except (TypeError, ValueError):
            return f"malformed source record {record!r:.80}"
        if filename in unchanged:
            continue
        lines = linecache.getlines(filename)
        if not lines:
            return f"{filename} is gone"
        if not (isinstance(first, int) and isinstance(last, int) and 1 <= first < last):
            return f"malformed source record {record!r:.80}"
        if _digest_lines(lines[first - 1:last - 1]) != digest:
            return f"{qualname} ({filename}:{first}) changed"
    return None


# A file modified this recently may be modified again within one tick of the
# file system's clock, keeping its time (git's "racily clean" entries):
# such a file gets no stat record and is always read.
_RACY_NS = 2_000_000_000


def source_stats(records: Sequence[Any]) -> list[list[Any]]:
    """``[file, size, mtime_ns, ctime_ns, inode]`` of each file ``records``
    name, where its lines on disk now are the ones recorded: what lets a
    later process skip reading it (:func:`changed_source`), as git's index
    trusts a file whose size, times and inode are unchanged. The change
    time is what makes it safe: any write moves it, and no user-level tool
    sets it back (an edit of the same length with its modification time
    restored kept size and mtime, and ran stale code)."""
    now = time.time_ns()
    stats = []
    for filename in sorted({record[0] for record in records}):
        before = _stat_of(filename)
        if before is None or now - max(before[1], before[2]) < _RACY_NS:
            continue
        linecache.checkcache(filename)  # drops lines read before a change
        own = [record for record in records if record[0] == filename]
        if changed_source(own) is None and _stat_of(filename) == before:
            stats.append([filename, *before])
    return stats


def _stat_of(filename: str) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(filename)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino


def _unchanged_files(stats: Sequence[Any]) -> set[str]:
    """Files whose stat record still holds. Records of the older
    ``[file, size, mtime_ns]`` form hold for nothing: their files are read."""
    unchanged = set()
    for stat in stats:  # a list, as program_parts checked
        if isinstance(stat, list | tuple) and len(stat) == 5 and isinstance(stat[0], str) \
                and _stat_of(stat[0]) == tuple(stat[1:]):
            unchanged.add(stat[0])
    return unchanged


@functools.lru_cache(maxsize=4096)
def _code_digest(code: types.CodeType) -> str:
    """What a code object computes (:func:`ltc_cache.entries.keys.code_digest`) and
    which function it is (qualified name and file)."""
    parts = [code_digest(code), code.co_qualname, code.co_filename]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


SIMPLE = (type(None), bool, int, float, str, bytes)


def _versioned(module: str | None) -> bool:
    """Whether the key's torch and Python versions already pin what a
    module defines."""
    root = (module or "").partition(".")[0]
    return root in ("torch", "builtins") or root in sys.stdlib_module_names


def _class_digest(cls: type) -> str:
    # A class by what its own body defines: its bases, its functions by
    # their code, its constants by value, its dataclass fields by name. (Not
    # the other attributes: caches and registries that change as it is used.)
    if _versioned(cls.__module__):
        return ""
    parts = [f"{b.__module__}.{b.__qualname__}" for b in cls.__bases__]
    for name, value in sorted(vars(cls).items(), key=lambda item: item[0]):
        inner = getattr(value, "__func__", value)
        if isinstance(inner, types.FunctionType):
            parts.append(f"{name}=fn:{_code_digest(inner.__code__)}")
        elif isinstance(value, SIMPLE) and name not in ("__doc__", "__module__"):
            parts.append(f"{name}={type(value).__name__}:{value!r}")
        elif name == "__dataclass_fields__":
            parts.append(f"{name}={sorted(value)}")
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _qualified(obj: Any) -> str:
    return f"{getattr(obj, '__module__', None)}.{getattr(obj, '__qualname__', None)}"


def describe(obj: Any, depth: int = 0, _path: tuple[int, ...] = ()) -> Any:
    """``obj`` as msgpack data that is equal in another process exactly
    when the object is the same there (a class, function, module or builtin
    by name and code; a constant by value). Raises :class:`Unportable` for
    objects with no such description."""
    if depth > _DEPTH:
        raise Unportable("nested too deep to describe")
    if id(obj) in _path:  # a function whose closure holds itself
        return ["cycle", _path.index(id(obj))]
    if isinstance(obj, types.FunctionType | tuple | list):
        _path = (*_path, id(obj))
    return _describe(obj, depth, _path)


def _describe(obj: Any, depth: int, path: tuple[int, ...]) -> Any:
    def describe(inner: Any, depth: int) -> Any:
        return globals()["describe"](inner, depth, path)

    if isinstance(obj, SIMPLE):
        return ["v", type(obj).__name__, obj]
    if isinstance(obj, enum.Enum):
        return ["enum", _qualified(type(obj)), obj.name]
    if isinstance(obj, tuple | list | frozenset) and len(obj) <= 64:
        items = sorted(obj, key=repr) if isinstance(obj, frozenset) else obj
        return [type(obj).__name__, [describe(v, depth + 1) for v in items]]
    if isinstance(obj, types.ModuleType):
        return ["module", obj.__name__]
    if isinstance(obj, type):
        return ["class", _qualified(obj), _class_digest(obj)]
    if isinstance(obj, types.FunctionType):
        return ["function", _qualified(obj), _code_digest(obj.__code__),
                describe(obj.__defaults__, depth + 1),
                describe(sorted((obj.__kwdefaults__ or {}).items()), depth + 1),
                [describe(_cell(c), depth + 1) for c in obj.__closure__ or ()]]
    if isinstance(obj, types.BuiltinFunctionType | types.WrapperDescriptorType
                  | types.MethodDescriptorType | types.MethodWrapperType
                  | types.ClassMethodDescriptorType):
        owner = getattr(obj, "__self__", None)
        where = owner.__name__ if isinstance(owner, types.ModuleType) else (
            _qualified(owner) if isinstance(owner, type) else type(owner).__qualname__)
        return ["builtin", where, getattr(obj, "__module__", None), obj.__qualname__]
    if isinstance(obj, types.MethodType) and isinstance(obj.__self__, type | types.ModuleType):
        return ["method", describe(obj.__func__, depth + 1), describe(obj.__self__, depth + 1)]
    if isinstance(obj, functools.partial):
        return ["partial", describe(obj.func, depth + 1), describe(obj.args, depth + 1),
                describe(sorted(obj.keywords.items()), depth + 1)]
    if isinstance(obj, property):
        return ["property", *(describe(f, depth + 1) for f in (obj.fget, obj.fset, obj.fdel))]
    if isinstance(obj, types.CodeType):
        return ["code", _code_digest(obj)]
    if isinstance(obj, OpOverload | OpOverloadPacket):
        return ["op", str(obj)]
    if isinstance(obj, torch.dtype | torch.device):
        return ["v", type(obj).__name__, str(obj)]
    if obj is dataclasses.MISSING:
        return ["missing"]
    if isinstance(obj, dataclasses.Field):
        # A dataclass field, as the validators of transformers' configs
        # hold in their closures (setting config.problem_type runs one).
        return ["field", obj.name, describe(obj.type, depth + 1),
                describe(obj.default, depth + 1), describe(obj.default_factory, depth + 1)]
    if type(obj).__module__ == "typing" and not isinstance(obj, type):
        # typing's special forms and aliases (Optional, Union[...], ...),
        # which transformers' forwards reach (BERT's classifier), are
        # what their repr names.
        return ["typing", repr(obj)]
    if isinstance(obj, types.UnionType):
        # ``int | None`` in an annotation (BART's forward reaches one).
        return ["union", [describe(arg, depth + 1) for arg in obj.__args__]]
    raise Unportable(f"cannot describe a {type(obj).__module__}.{type(obj).__qualname__} "
                     "across processes")


def _cell(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None
