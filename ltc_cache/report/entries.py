"""Reading whole entries: ``show`` and ``verify``.

These decode entry bodies, and decoding imports torch (ltc_cache.graph.entry);
the import happens on the first call, so a listing never pays for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import EntryError
from ..kinds import EntryKind
from ..store.disk import DiskStore

if TYPE_CHECKING:
    from ..graph.entry import Entry

__all__ = ["EntryProblem", "Progress", "VerifyReport", "decode_entry", "describe_source",
           "load_entry", "verify"]

# Progress callbacks get the number of items just done.
Progress = Callable[[int], None]


@dataclass(frozen=True)
class EntryProblem:
    key: str
    problem: str


def decode_entry(data: bytes, key: str, secret: bytes | None) -> Entry:
    """Entry bytes -> Entry; raises EntryError unless they are a good entry of ``key``."""
    from ..graph.entry import decode

    return decode(data, expected_key=key, secret=secret)


def load_entry(store: DiskStore, key: str, *, secret: bytes | None = None) -> Entry:
    """The decoded Entry of ``key``; raises KeyError or EntryError."""
    try:
        data = store.peek(key)
    except OSError as exc:
        raise EntryError(f"cannot read ({exc})", key) from None
    if data is None:
        raise KeyError(f"no entry with key {key}")
    return decode_entry(data, key, secret)


def describe_source(source: Any) -> str:
    """A graph input or output in a word: ``arg 0``, ``attr fc.weight``,
    ``const float64[] = 2.5``."""
    kind, ref = source
    if kind == "const" and hasattr(ref, "dtype"):
        dtype = str(ref.dtype).removeprefix("torch.")
        shape = ",".join(str(d) for d in ref.shape)
        value = f" = {ref.item():g}" if ref.numel() == 1 else ""
        return f"const {dtype}[{shape}]{value}"
    if kind == "none":
        return "none"
    return f"{kind} {ref}"


@dataclass(frozen=True)
class VerifyReport:
    checked: int
    problems: tuple[EntryProblem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(store: DiskStore, keys: Iterable[str], *, secret: bytes | None = None,
           progress: Progress | None = None) -> VerifyReport:
    """Check each entry: readable, checksum (and signature), body decodes,
    stored under its own key, and its IR (or a plan's graph) parses; a
    program's or a fused library's signature holds (where this user has
    the key that signs them; nothing is unpickled, no library loaded)."""
    import torch

    from ..compile_backend.joint import joint_graphs
    from ..compile_backend.plan import plan_graph
    from ..program.entries import check_program
    from .fused import check_fused

    checked, problems = 0, []
    for key in keys:
        try:
            data = store.peek(key)
            if data is None:  # deleted meanwhile
                continue
            entry = decode_entry(data, key, secret)
            if entry.ir:
                torch._C.parse_ir(entry.ir)
            if entry.kind == EntryKind.PLAN and "joint" in entry.payload:
                joint_graphs(entry)  # a training plan: both graphs and their layout
            elif entry.kind == EntryKind.PLAN:
                plan_graph(entry)
            elif entry.kind == EntryKind.PROGRAM:
                check_program(entry, secret, store.directory)
            elif entry.kind == EntryKind.FUSED:
                check_fused(entry, secret)
        except EntryError as exc:
            problems.append(EntryProblem(key, str(exc)))
        except RuntimeError as exc:  # parse_ir
            problems.append(EntryProblem(key, f"IR does not parse ({str(exc).splitlines()[0]})"))
        except OSError as exc:
            problems.append(EntryProblem(key, f"cannot read ({type(exc).__name__}: {exc})"))
        checked += 1
        if progress:
            progress(1)
    return VerifyReport(checked, tuple(problems))
