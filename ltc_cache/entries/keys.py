"""Cache keys hashed from named parts, so that a miss can be explained.

Each part is hashed on its own and logged at DEBUG; the key is the hash of
the part hashes. Two entries of one graph name whose keys differ can then be
told apart part by part (:func:`differing_parts`). What every product's keys
share; the key of a graph LTC traces is :mod:`ltc_cache.graph.graph_keys`'s.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import types
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["CacheKey", "code_digest", "constant_text", "derived_key", "differing_parts",
           "hash_lines", "key_from_parts"]

logger = logging.getLogger("ltc_cache.keys")


@dataclass(frozen=True)
class CacheKey:
    digest: str  # hex sha256 over the part hashes
    parts: Mapping[str, str]  # part name -> hex sha256 of that part

    def __str__(self) -> str:
        return self.digest

def hash_lines(lines: Iterator[str] | Sequence[str]) -> str:
    return hashlib.sha256("".join(f"{line}\0" for line in lines).encode()).hexdigest()

def derived_key(key: CacheKey, **texts: str) -> CacheKey:
    """``key`` with more parts, each hashed from its text: the key of
    something made from the graph ``key`` names (a partitioning plan)."""
    added = {name: hash_lines([text]) for name, text in texts.items()}
    return key_from_parts({**key.parts, **added})


@functools.lru_cache(maxsize=4096)
def code_digest(code: types.CodeType) -> str:
    """What a code object computes, not where it sits (no file, line or
    name, so the digest is the same on every machine): bytecode, names,
    constants (nested code by its digest), argument layout."""
    consts = [(code_digest(c) if isinstance(c, types.CodeType) else constant_text(c))
              for c in code.co_consts]
    parts = [code.co_code.hex(), repr(code.co_names), repr(code.co_varnames),
             repr(code.co_freevars), repr(code.co_cellvars), repr(consts),
             f"{code.co_argcount},{code.co_posonlyargcount},{code.co_kwonlyargcount}",
             str(code.co_flags)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _holds_a_set(value: Any) -> bool:
    return isinstance(value, frozenset) or (
        isinstance(value, tuple) and any(_holds_a_set(v) for v in value))


def constant_text(value: Any) -> str:
    """A code constant as text, the same in every process. A frozenset
    (``x in {"a", "b"}`` compiles to one) iterates, and so reprs, in the
    order of its items' hashes, which ``PYTHONHASHSEED`` changes from one
    process to the next: its items are sorted
    (docs/torch/dynamo.md#frozenset-repr-follows-the-hash-seed).
    Other constants are their repr, as before."""
    if isinstance(value, frozenset):
        return f"frozenset:[{','.join(sorted(constant_text(v) for v in value))}]"
    if isinstance(value, tuple) and _holds_a_set(value):
        return f"tuple:({','.join(constant_text(v) for v in value)})"
    return f"{type(value).__name__}:{value!r}"


def key_from_parts(parts: dict[str, str]) -> CacheKey:
    digest = hash_lines(f"{name}={value}" for name, value in parts.items())
    for name, value in parts.items():
        logger.debug("key %s part %s = %s", digest[:12], name, value[:12])
    return CacheKey(digest, parts)


def differing_parts(a: Mapping[str, str], b: Mapping[str, str]) -> list[str]:
    """Names of the key parts in which two keys differ."""
    return sorted(name for name in a.keys() | b.keys() if a.get(name) != b.get(name))
