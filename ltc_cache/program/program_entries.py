"""Whole compiled programs as cache entries: their key, their signature, the
sources they were made from, and the checks that stand in for the guards
Dynamo cannot save.

A program (:mod:`ltc_cache.program.precompile`) is what Dynamo's AOT precompile
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
- ``source_stats``: the size, modification and change times and inode of
  those files when the lines were recorded; a file that still has all four
  is not read again;
- ``checks``: what the guards that cannot be serialised (object identities:
  classes, functions, modules, builtins; and guards reached through them)
  checked, as expressions with the value each must have
  (:func:`portable_check`), compared on load and on every call.

Nothing here imports Dynamo; :mod:`ltc_cache.program.precompile` drives it.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import platform
import sys
import types
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgpack
import torch

from ..entries.entry import Entry, new_meta
from ..entries.keys import CacheKey, hash_lines, key_from_parts
from ..entries.kinds import EntryKind
from ..entries.wire import PROGRAM_FORMAT
from ..errors import EntryError, UncacheableGraph
from ..graph.graph_keys import tensor_signature
from ..signing import key_path, read_key
from .describe import OBJECT_DEPTH, plain_object, source_stats

__all__ = ["VERSION", "ProgramParts", "check_program", "negative_program_entry", "program_entry",
           "program_key", "program_parts", "sign", "spec_text"]

logger = logging.getLogger("ltc_cache.program")

# 2: a graph break is a program of several frames (an old negative entry for
# it would keep the function on torch.compile).
VERSION = 2


# --- the key -------------------------------------------------------------------


def _spec(value: Any, depth: int = 0) -> str:
    """An argument's layout, stable across processes: tensors by layout,
    Python values by type and value. Raises UncacheableGraph."""
    if depth > OBJECT_DEPTH:
        raise UncacheableGraph("an argument nested deeper than ltc_cache describes")
    if isinstance(value, torch.Tensor):
        return "tensor:" + tensor_signature(value)
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
        yield f"{name}:{tensor_signature(t)}"


def program_key(fn: types.FunctionType, owner: torch.nn.Module | None, args: Sequence[Any],
                kwargs: Mapping[str, Any]) -> CacheKey:
    """The key of ``fn`` compiled for a call with ``args`` and ``kwargs``
    (``owner``: the module ``fn`` is the forward of, whose structure is part
    of the key). The sources Dynamo inlines are not known before capture:
    they are stored in the entry and compared on load."""
    parts = {
        "format": hash_lines([f"{PROGRAM_FORMAT}:{VERSION}"]),
        "torch": hash_lines([torch.__version__, str(torch.version.git_version)]),
        "python": hash_lines([sys.version, platform.python_implementation()]),
        "function": hash_lines([fn.__module__, fn.__qualname__, fn.__code__.co_filename]),
        "structure": hash_lines(_structure(owner) if owner is not None else ["-"]),
        "grad_mode": hash_lines([f"grad={torch.is_grad_enabled()}",
                            f"inference={torch.is_inference_mode_enabled()}",
                            f"autocast={torch.is_autocast_enabled()}"]),
        # Dynamo's global-state guard checks the thread count: without it in
        # the key, workers with other --threads overwrote each other's program.
        "threads": hash_lines([f"threads={torch.get_num_threads()}"]),
        "inputs": hash_lines([spec_text(args, kwargs)]),
        "backend": hash_lines(["TorchScript", "CUDA" if "LTC_TS_CUDA" in os.environ else "CPU"]),
    }
    return key_from_parts(parts)


# --- entries -------------------------------------------------------------------


class ProgramParts:
    """What a program entry holds, once its signature has been checked."""

    __slots__ = ("artifact", "checks", "checks_code", "frames", "globals", "name", "source_stats",
                 "sources")

    def __init__(self, name: str, sources: list[Any], checks: list[Any], globals_: list[str],
                 artifact: bytes, frames: dict[str, Any] | None = None,
                 checks_code: list[Any] | None = None,
                 source_stats: list[Any] | None = None) -> None:
        self.name = name
        # Absent in programs stored before it: every source file is read.
        self.source_stats = source_stats or []
        # The checks' code as the capturing process compiled it (marshalled,
        # by the digest of its source); absent in programs stored before it.
        self.checks_code = checks_code or []
        # None for one graph (Dynamo's AOT precompile); for a function Dynamo
        # compiles as several frames (:mod:`ltc_cache.program.frames`), what they are
        # (``codes``, ``breaks``), and ``checks`` per frame.
        self.frames = frames
        self.sources = sources
        self.checks = checks
        self.globals = globals_
        self.artifact = artifact


def sign(secret: bytes, key: str, sources: Any, checks: Any, globals_: Any,
         artifact: bytes, frames: Any = None, checks_code: Any = None,
         source_stats: Any = None) -> bytes:
    """HMAC-SHA256 over everything a program entry holds, and the key it is
    stored under (a signed program cannot be moved under another key).
    ``frames`` (a program of several frames) is signed too, so one kind of
    program cannot be passed off as the other; so is ``checks_code``, code
    a later process runs, and ``source_stats``, which decides what it
    reads."""
    parts = [PROGRAM_FORMAT, VERSION, key, sources, checks, globals_, artifact]
    if frames is not None:
        parts.append(["frames", frames])
    if checks_code is not None:
        parts.append(["checks_code", checks_code])
    if source_stats is not None:
        parts.append(["source_stats", source_stats])
    signed = msgpack.packb(parts, use_bin_type=True)
    return hmac.new(secret, signed, hashlib.sha256).digest()


def program_entry(key: CacheKey, name: str, *, sources: list[Any], checks: list[Any],
                  globals_: list[str], artifact: bytes, secret: bytes,
                  node_count: int, frames: dict[str, Any] | None = None,
                  checks_code: list[Any] | None = None) -> Entry:
    """The entry of kind ``program``, whose payload holds ``sources``
    (:func:`code_record`), ``checks`` (:func:`portable_check`), ``globals_``
    (module globals the guards read, refreshed before each check), the
    pickled ``artifact``, and their signature. ``frames``: for a program of
    several frames, ``{"codes": [[qualname, file, first line, guarded
    codes], ...], "breaks": [[reason, count], ...]}``, and ``checks`` is
    ``[code index, guarded index, checks]`` per frame. ``checks_code``:
    the checks' code as this process compiled it
    (:meth:`~ltc_cache.program.guards.Checks.compiled`), which a later
    process runs instead of compiling it again (the key names the Python
    version that reads it)."""
    meta = new_meta(graph_name=name, node_count=node_count, graph_hash="",
                    key_parts=key.parts)
    stats = source_stats(sources)
    payload = {
        "format": PROGRAM_FORMAT, "version": VERSION, "sources": sources, "checks": checks,
        "globals": globals_, "artifact": artifact,
        "hmac": sign(secret, key.digest, sources, checks, globals_, artifact, frames,
                     checks_code or None, stats or None),
        "python": platform.python_version(),
    }
    if frames is not None:
        payload["frames"] = frames
    if checks_code:
        payload["checks_code"] = checks_code
    if stats:
        payload["source_stats"] = stats
    return Entry(key.digest, "", (), (), (), meta, kind=EntryKind.PROGRAM, payload=payload)


def negative_program_entry(key: CacheKey, name: str, reason: str,
                           sources: list[Any]) -> Entry:
    """A program that cannot be made (a graph break, a guard that cannot be
    saved): remembered, so a warm start goes straight to ``torch.compile``
    until ``sources`` (the compiled function's own) change."""
    meta = new_meta(graph_name=name, node_count=0, graph_hash="", key_parts=key.parts)
    return Entry(key.digest, "", (), (), (), meta, kind=EntryKind.NEGATIVE,
                 payload={"reason": reason[:2000], "program_sources": sources})


def program_parts(entry: Entry, secret: bytes) -> ProgramParts:
    """The parts of a program entry whose signature holds; raises
    EntryError for anything else. Nothing is unpickled here."""
    program = entry.payload
    if entry.kind != EntryKind.PROGRAM or program.get("format") != PROGRAM_FORMAT \
            or program.get("version") != VERSION:
        raise EntryError("not a program of this ltc_cache", entry.key)
    sources, checks = program.get("sources"), program.get("checks")
    globals_, artifact = program.get("globals"), program.get("artifact")
    signature, frames = program.get("hmac"), program.get("frames")
    checks_code, stats = program.get("checks_code"), program.get("source_stats")
    if (frames is not None and not isinstance(frames, dict)) \
            or (checks_code is not None and not isinstance(checks_code, list)) \
            or (stats is not None and not isinstance(stats, list)):
        raise EntryError("program: malformed", entry.key)
    if not isinstance(artifact, bytes) or not isinstance(sources, list) \
            or not isinstance(checks, list) or not isinstance(globals_, list) \
            or not all(isinstance(g, str) for g in globals_):
        raise EntryError("program: malformed", entry.key)
    if not isinstance(signature, bytes):
        raise EntryError("program: unsigned", entry.key)
    if not hmac.compare_digest(signature,
                               sign(secret, entry.key, sources, checks, globals_, artifact,
                                    frames, checks_code, stats)):
        raise EntryError("program: signature mismatch (tampered with, or signed with another "
                         "key)", entry.key)
    return ProgramParts(entry.graph_name, sources, checks, globals_, artifact, frames,
                        checks_code, stats)


def check_program(entry: Entry, shared: bytes | None, cache_dir: Path) -> None:
    """Raise EntryError unless ``entry`` is a well-formed program whose
    signature holds under this user's key (``ltc-cache verify``); a
    malformed one fails even where no key is to be had. Never creates the
    key, never unpickles."""
    try:
        secret = shared or read_key(key_path())
    except OSError:
        secret = None
    if secret is None:
        if entry.kind != EntryKind.PROGRAM or not isinstance(entry.payload.get("artifact"), bytes):
            raise EntryError("program: malformed", entry.key)
        return
    program_parts(entry, secret)


# --- the signing key -----------------------------------------------------------


