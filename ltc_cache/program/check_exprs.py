"""The per-call check of a program: its guard expressions made cheaper,
and its source compiled once a process.

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
import functools
import types

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


@functools.lru_cache(maxsize=64)
def checks_code(source: str) -> types.CodeType:
    """``source`` (the functions that evaluate and check a program's
    portable checks) compiled. The programs of one function for several
    input layouts (one a prompt length) mostly have the same checks, so the
    same source: compiled once, not once a program (~15 ms each for GPT-2's
    150 checks). The values each program compares are not in the source."""
    return builtins.compile(source, "<ltc_cache program checks>", "exec")
