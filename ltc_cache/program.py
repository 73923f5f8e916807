"""Whole compiled programs as cache entries: their key, their signature, the
sources they were made from, and the checks that stand in for the guards
Dynamo cannot save.

A program (:mod:`ltc_cache.precompile`) is what Dynamo's AOT precompile
makes of a function: the transformed bytecode, its guards and the FX graph
the ltc_cache backend compiles. Its artifact is a pickle, which this cache
refuses everywhere else, so a program entry holds it beside an HMAC-SHA256
signature made with a key that never lives in the cache directory
(:func:`program_secret`), and the artifact is unpickled only once the
signature holds. Everything else in the entry is msgpack data, signed with
the artifact:

- ``sources``: every function Dynamo inlined, as a file, a line range and
  the SHA-256 of those lines, compared with the files on load
  (:func:`changed_source`): Dynamo records these but never compares them;
- ``checks``: what the guards that cannot be serialised (object identities:
  classes, functions, modules, builtins; and guards reached through them)
  checked, as expressions with the value each must have
  (:func:`portable_check`), compared on load and on every call.

Nothing here imports Dynamo; :mod:`ltc_cache.precompile` drives it.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import hmac
import inspect
import linecache
import logging
import os
import platform
import re
import secrets
import sys
import types
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgpack
import torch

from .entry import Entry, new_meta
from .errors import EntryError, UncacheableGraph
from .keys import CacheKey, _hash, _key, _tensor_signature, code_digest
from .wire import PROGRAM_FORMAT

__all__ = ["VERSION", "ProgramParts", "Unportable", "changed_source", "check_program",
           "code_record",
           "describe", "negative_program_entry", "program_entry", "program_key",
           "program_parts", "program_secret", "sign", "spec_text"]

logger = logging.getLogger("ltc_cache.program")

# 2: a graph break is a program of several frames (an old negative entry for
# it would keep the function on torch.compile).
VERSION = 2
# The per-user signing key, created on first use (mode 0600).
KEY_FILE = "program.key"
_KEY_BYTES = 32
# How deep a function's closure and defaults are described.
_DEPTH = 12
# How deep an argument's containers and objects are described (a
# StaticCache: the cache, its list of layers, each layer, its tensors).
OBJECT_DEPTH = 8


class Unportable(ValueError):
    """A program that cannot be stored safely (a guard this module cannot
    check in another process, a function without a source file)."""


# --- the key -------------------------------------------------------------------


def _spec(value: Any, depth: int = 0) -> str:
    """An argument's layout, stable across processes: tensors by layout,
    Python values by type and value. Raises UncacheableGraph."""
    if depth > OBJECT_DEPTH:
        raise UncacheableGraph("an argument nested deeper than ltc_cache describes")
    if isinstance(value, torch.Tensor):
        return "tensor:" + _tensor_signature(value)
    if value is None or isinstance(value, bool | int | float | str):
        return f"{type(value).__name__}:{value!r}"
    if isinstance(value, torch.dtype | torch.device | torch.memory_format | torch.layout):
        return f"{type(value).__name__}:{value}"
    if isinstance(value, tuple | list):
        return f"{type(value).__name__}:[{','.join(_spec(v, depth + 1) for v in value)}]"
    if isinstance(value, dict):
        items = ",".join(f"{k!r}={_spec(v, depth + 1)}" for k, v in value.items())
        return f"{type(value).__name__}:{{{items}}}"
    if plain_object(value):  # a key/value cache: its class and its state
        cls = type(value)
        items = ",".join(f"{k}={_spec(v, depth + 1)}" for k, v in sorted(vars(value).items()))
        return f"{cls.__module__}.{cls.__qualname__}:{{{items}}}"
    raise UncacheableGraph(f"no stable program key for an argument of type "
                           f"{type(value).__name__}")


def plain_object(value: Any) -> bool:
    """An object described by its class and its attributes (a transformers
    ``StaticCache`` and its layers: tensors, numbers, lists): not a module,
    a function, a class, nor anything else whose identity matters."""
    return (hasattr(value, "__dict__") and type(value).__module__ != "builtins"
            and not isinstance(value, torch.nn.Module | types.ModuleType | type
                               | types.FunctionType | types.MethodType))


def spec_text(args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    """The input specs of a call (shapes, dtypes, strides, devices,
    requires_grad; Python values by value)."""
    return _spec(tuple(args)) + "|" + _spec(dict(kwargs))


def _structure(module: torch.nn.Module) -> Iterable[str]:
    # Every submodule by path, class and train/eval flag, every parameter and
    # buffer by layout: a changed structure is another key, not a guard miss.
    for path, sub in module.named_modules(remove_duplicate=False):
        yield f"{path}={type(sub).__module__}.{type(sub).__qualname__} training={sub.training}"
    for name, t in (*module.named_parameters(remove_duplicate=False),
                    *module.named_buffers(remove_duplicate=False)):
        yield f"{name}:{_tensor_signature(t)}"


def program_key(fn: types.FunctionType, owner: torch.nn.Module | None, args: Sequence[Any],
                kwargs: Mapping[str, Any]) -> CacheKey:
    """The key of ``fn`` compiled for a call with ``args`` and ``kwargs``
    (``owner``: the module ``fn`` is the forward of, whose structure is part
    of the key). The sources Dynamo inlines are not known before capture:
    they are stored in the entry and compared on load."""
    parts = {
        "format": _hash([f"{PROGRAM_FORMAT}:{VERSION}"]),
        "torch": _hash([torch.__version__, str(torch.version.git_version)]),
        "python": _hash([sys.version, platform.python_implementation()]),
        "function": _hash([fn.__module__, fn.__qualname__, fn.__code__.co_filename]),
        "structure": _hash(_structure(owner) if owner is not None else ["-"]),
        "grad_mode": _hash([f"grad={torch.is_grad_enabled()}",
                            f"inference={torch.is_inference_mode_enabled()}",
                            f"autocast={torch.is_autocast_enabled()}"]),
        # Dynamo's global-state guard checks the thread count: without it in
        # the key, workers with other --threads overwrote each other's program.
        "threads": _hash([f"threads={torch.get_num_threads()}"]),
        "inputs": _hash([spec_text(args, kwargs)]),
        "backend": _hash(["TorchScript", "CUDA" if "LTC_TS_CUDA" in os.environ else "CPU"]),
    }
    return _key(parts)


# --- sources -------------------------------------------------------------------


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


def changed_source(records: Sequence[Any]) -> str | None:
    """The first recorded source that is not what the files now say (a
    reason, for the log), or None when all are the same."""
    for record in records:
        try:
            filename, first, last, digest, qualname = record
        except (TypeError, ValueError):
            return f"malformed source record {record!r:.80}"
        lines = linecache.getlines(filename)
        if not lines:
            return f"{filename} is gone"
        if not (isinstance(first, int) and isinstance(last, int) and 1 <= first < last):
            return f"malformed source record {record!r:.80}"
        if _digest_lines(lines[first - 1:last - 1]) != digest:
            return f"{qualname} ({filename}:{first}) changed"
    return None


# --- describing objects across processes ---------------------------------------


@functools.lru_cache(maxsize=4096)
def _code_digest(code: types.CodeType) -> str:
    """What a code object computes (:func:`ltc_cache.keys.code_digest`) and
    which function it is (qualified name and file)."""
    parts = [code_digest(code), code.co_qualname, code.co_filename]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


_SIMPLE = (type(None), bool, int, float, str, bytes)


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
        elif isinstance(value, _SIMPLE) and name not in ("__doc__", "__module__"):
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

    if isinstance(obj, _SIMPLE):
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
    if isinstance(obj, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
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


# --- checks standing in for guards --------------------------------------------

# Guard kinds a check can take the place of, and what it compares.
_IDENTITY_GUARDS = frozenset({"ID_MATCH", "CLASS_MATCH", "FUNCTION_MATCH", "CLOSURE_MATCH",
                              "MODULE_MATCH", "BUILTIN_MATCH"})
_VALUE_GUARDS = frozenset({"CONSTANT_MATCH", "EQUALS_MATCH"})


# Globals Dynamo installs under a name made of an object id and the compile
# id (``OutputGraph.install_global_by_id``: ``f"{prefix}_{id(value)}_c{n}"``;
# ``type(x)`` of a tensor reads ``torch.Tensor`` through one). The name
# exists only in the capturing process.
_BY_ID_GLOBAL = re.compile(r"G\['(\w*_\d{6,}_c\d+)'\]")


def portable_expression(expr: str, globals_: Mapping[str, Any]) -> str:
    """``expr`` (a guard's source) with every global that Dynamo named
    after an object id replaced by an expression that finds the same
    object in any process: ``__import__(name)`` for a module. Raises
    Unportable where such a global holds anything else (its name, and so
    the check, would hold in this process only)."""

    def stand_in(match: re.Match[str]) -> str:
        name = match.group(1)
        value = globals_.get(name)
        if isinstance(value, types.ModuleType) and sys.modules.get(value.__name__) is value:
            return f"__import__({value.__name__!r}, fromlist=['_'])"
        raise Unportable(f"a guard names {name}, a global named after an object id "
                         f"({type(value).__name__})")

    return _BY_ID_GLOBAL.sub(stand_in, expr)


def names_process_specific(expr: str) -> bool:
    """Whether ``expr`` names a global named after an object id."""
    return _BY_ID_GLOBAL.search(expr) is not None


def portable_check(expr: str, guard_type: str, derived: Sequence[str], has_value: bool,
                   value: Any) -> list[Any]:
    """The check that stands in for a guard Dynamo cannot save: ``[expr,
    kind, expected]``, where ``expr`` is the guard's source (``L[...]``,
    ``G[...]``). ``same``: the object is described alike on load and is the
    very object on each later call; ``eq``: equal to a constant; ``type``:
    of a class described alike; ``len``: of a length. Raises Unportable."""
    if not has_value:
        raise Unportable(f"{guard_type} guard on {expr} has no value to compare")
    if guard_type in _IDENTITY_GUARDS or "ID_MATCH" in derived:
        return [expr, "same", describe(value)]
    if guard_type in _VALUE_GUARDS:
        if not isinstance(value, _SIMPLE) and not isinstance(value, enum.Enum):
            raise Unportable(f"{guard_type} guard on {expr}: a {type(value).__name__}")
        return [expr, "same" if isinstance(value, enum.Enum) else "eq", describe(value)]
    if guard_type == "TYPE_MATCH":
        return [expr, "type", describe(type(value))]
    if guard_type == "SEQUENCE_LENGTH":
        return [expr, "len", len(value)]
    raise Unportable(f"{guard_type} guard on {expr}")


# --- entries -------------------------------------------------------------------


class ProgramParts:
    """What a program entry holds, once its signature has been checked."""

    __slots__ = ("artifact", "checks", "frames", "globals", "name", "sources")

    def __init__(self, name: str, sources: list[Any], checks: list[Any], globals_: list[str],
                 artifact: bytes, frames: dict[str, Any] | None = None) -> None:
        self.name = name
        # None for one graph (Dynamo's AOT precompile); for a function Dynamo
        # compiles as several frames (:mod:`ltc_cache.frames`), what they are
        # (``codes``, ``breaks``), and ``checks`` per frame.
        self.frames = frames
        self.sources = sources
        self.checks = checks
        self.globals = globals_
        self.artifact = artifact


def sign(secret: bytes, key: str, sources: Any, checks: Any, globals_: Any,
         artifact: bytes, frames: Any = None) -> bytes:
    """HMAC-SHA256 over everything a program entry holds, and the key it is
    stored under (a signed program cannot be moved under another key).
    ``frames`` (a program of several frames) is signed too, so one kind of
    program cannot be passed off as the other."""
    parts = [PROGRAM_FORMAT, VERSION, key, sources, checks, globals_, artifact]
    if frames is not None:
        parts.append(["frames", frames])
    signed = msgpack.packb(parts, use_bin_type=True)
    return hmac.new(secret, signed, hashlib.sha256).digest()


def program_entry(key: CacheKey, name: str, *, sources: list[Any], checks: list[Any],
                  globals_: list[str], artifact: bytes, secret: bytes,
                  node_count: int, frames: dict[str, Any] | None = None) -> Entry:
    """The entry of kind ``program``, whose payload holds ``sources``
    (:func:`code_record`), ``checks`` (:func:`portable_check`), ``globals_``
    (module globals the guards read, refreshed before each check), the
    pickled ``artifact``, and their signature. ``frames``: for a program of
    several frames, ``{"codes": [[qualname, file, first line, guarded
    codes], ...], "breaks": [[reason, count], ...]}``, and ``checks`` is
    ``[code index, guarded index, checks]`` per frame."""
    meta = new_meta(graph_name=name, node_count=node_count, graph_hash="",
                    key_parts=key.parts)
    payload = {
        "format": PROGRAM_FORMAT, "version": VERSION, "sources": sources, "checks": checks,
        "globals": globals_, "artifact": artifact,
        "hmac": sign(secret, key.digest, sources, checks, globals_, artifact, frames),
        "python": platform.python_version(),
    }
    if frames is not None:
        payload["frames"] = frames
    return Entry(key.digest, "", (), (), (), meta, kind="program", payload=payload)


def negative_program_entry(key: CacheKey, name: str, reason: str,
                           sources: list[Any]) -> Entry:
    """A program that cannot be made (a graph break, a guard that cannot be
    saved): remembered, so a warm start goes straight to ``torch.compile``
    until ``sources`` (the compiled function's own) change."""
    meta = new_meta(graph_name=name, node_count=0, graph_hash="", key_parts=key.parts)
    return Entry(key.digest, "", (), (), (), meta, kind="negative",
                 payload={"reason": reason[:2000], "program_sources": sources})


def program_parts(entry: Entry, secret: bytes) -> ProgramParts:
    """The parts of a program entry whose signature holds; raises
    EntryError for anything else. Nothing is unpickled here."""
    program = entry.payload
    if entry.kind != "program" or program.get("format") != PROGRAM_FORMAT \
            or program.get("version") != VERSION:
        raise EntryError("not a program of this ltc_cache", entry.key)
    sources, checks = program.get("sources"), program.get("checks")
    globals_, artifact = program.get("globals"), program.get("artifact")
    signature, frames = program.get("hmac"), program.get("frames")
    if frames is not None and not isinstance(frames, dict):
        raise EntryError("program: malformed", entry.key)
    if not isinstance(artifact, bytes) or not isinstance(sources, list) \
            or not isinstance(checks, list) or not isinstance(globals_, list) \
            or not all(isinstance(g, str) for g in globals_):
        raise EntryError("program: malformed", entry.key)
    if not isinstance(signature, bytes):
        raise EntryError("program: unsigned", entry.key)
    if not hmac.compare_digest(signature,
                               sign(secret, entry.key, sources, checks, globals_, artifact,
                                    frames)):
        raise EntryError("program: signature mismatch (tampered with, or signed with another "
                         "key)", entry.key)
    return ProgramParts(entry.graph_name, sources, checks, globals_, artifact, frames)


def check_program(entry: Entry, shared: bytes | None, cache_dir: Path) -> None:
    """Raise EntryError unless ``entry`` is a well-formed program whose
    signature holds under this user's key (``ltc-cache verify``); a
    malformed one fails even where no key is to be had. Never creates the
    key, never unpickles."""
    try:
        secret = shared or _read_key(key_path())
    except OSError:
        secret = None
    if secret is None:
        if entry.kind != "program" or not isinstance(entry.payload.get("artifact"), bytes):
            raise EntryError("program: malformed", entry.key)
        return
    program_parts(entry, secret)


# --- the signing key -----------------------------------------------------------


def _config_dir(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "ltc_cache"


def key_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where the per-user signing key of programs lives."""
    return _config_dir(os.environ if environ is None else environ) / KEY_FILE


def program_secret(shared: bytes | None, cache_dir: Path, *,
                   environ: Mapping[str, str] | None = None) -> bytes:
    """The key that signs program entries: ``shared`` (LTC_CACHE_SECRET,
    the fleet's key) where set, else a per-user key created on first use,
    mode 0600, under ``$XDG_CONFIG_HOME/ltc_cache`` (else
    ``~/.config/ltc_cache``). Raises OSError where there is none to be had
    safely (the file inside the cache directory, readable by others, owned
    by another user)."""
    if shared:
        return shared
    path = key_path(environ)
    if path.resolve().is_relative_to(Path(cache_dir).resolve()):
        raise PermissionError(f"the program key {path} would be inside the cache "
                              f"directory {cache_dir}")
    try:
        return _read_key(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temp = path.with_name(f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, secrets.token_hex(_KEY_BYTES).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(temp, path)  # fails where another process made it first: use that one
    except FileExistsError:
        pass
    finally:
        os.unlink(temp)
    logger.info("created the program signing key %s", path)
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise PermissionError(f"the program key {path} belongs to another user")
        if st.st_mode & 0o077:
            raise PermissionError(f"the program key {path} is readable or writable by "
                                  f"others (mode {st.st_mode & 0o777:o}); chmod 600 it")
        data = os.read(fd, 4096).strip()
    finally:
        os.close(fd)
    if len(data) < 32:
        raise PermissionError(f"the program key {path} is too short")
    return data
