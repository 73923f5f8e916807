"""The per-call check of a program: its guard expressions made cheaper,
and its source compiled once, by the process that captured the program.

Dynamo names a value read from a class's or an object's attribute
dictionary ``dict(X.__dict__)['name']``: evaluated as written, every call
copies the whole dictionary (a class's has dozens of entries) to read one
key. ``X.__dict__['name']`` reads the same entry (or raises the same
``KeyError``) without the copy. The values a program was made with are
still resolved from the expressions as Dynamo wrote them; only the
generated per-call function reads the cheaper form.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import marshal
import types
from collections.abc import Mapping, Sequence
from typing import Any

_CALL = "dict("
_TAIL = ".__dict__"


def _closing(expr: str, start: int) -> int | None:
    """The index of the parenthesis closing the one opened at ``start``
    (brackets and quoted strings inside skipped), or None."""
    depth, quote, i = 0, "", start
    while i < len(expr):
        c = expr[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i if c == ")" else None
        i += 1
    return None


def without_dict_copies(expr: str) -> str:
    """``expr`` with each ``dict(<...>.__dict__)[`` read as ``<...>.__dict__[``."""
    out, i = [], 0
    while True:
        j = expr.find(_CALL, i)
        if j < 0:
            out.append(expr[i:])
            return "".join(out)
        preceded = j > 0 and (expr[j - 1].isalnum() or expr[j - 1] in "_.")
        end = None if preceded else _closing(expr, j + len(_CALL) - 1)
        inner = expr[j + len(_CALL):end] if end is not None else ""
        if end is None or not inner.endswith(_TAIL) or expr[end + 1:end + 2] != "[":
            out.append(expr[i:j + len(_CALL)])
            i = j + len(_CALL)
            continue
        out.append(expr[i:j])
        out.append(without_dict_copies(inner))
        i = end + 1


# Compiled check sources of this process, by digest (most recent last).
_COMPILED: dict[str, types.CodeType] = {}
_KEPT = 64


def source_digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def checks_code(source: str, stored: Mapping[str, bytes] | None = None) -> types.CodeType:
    """``source`` (the functions that evaluate and check a program's
    portable checks) compiled: from ``stored`` (a program entry's
    marshalled code, by the digest of its source) where it holds it, else
    by the compiler. Kept a process: the programs of one function for
    several input layouts (one a prompt length) mostly have the same
    checks, so the same source. Compiling takes ~15 ms for GPT-2's 150
    checks, 9 ms of BERT's warm first step (docs/torch/dynamo.md#three-load-costs-paid-elsewhere);
    the values each program compares are not in the source."""
    digest = source_digest(source)
    code = _COMPILED.pop(digest, None)
    if code is None and stored and digest in stored:
        with contextlib.suppress(EOFError, ValueError, TypeError):
            code = marshal.loads(stored[digest])
    if not isinstance(code, types.CodeType):
        code = _compile(source)
    _COMPILED[digest] = code
    while len(_COMPILED) > _KEPT:
        del _COMPILED[next(iter(_COMPILED))]
    return code


def _compile(source: str) -> types.CodeType:
    return builtins.compile(source, "<ltc_cache program checks>", "exec")


def marshalled(digests: Sequence[str]) -> list[list[Any]]:
    """``[[digest, marshalled code], ...]`` of the check sources this
    process compiled under ``digests``, for a program entry (signed with
    it, and read back only by the Python version its key names)."""
    return [[digest, marshal.dumps(_COMPILED[digest])] for digest in digests
            if digest in _COMPILED]
