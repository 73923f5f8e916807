"""Reading whole entries: ``show`` and ``verify``, each kind's part of them
by its registration (entries/kind_registry.py).

These decode entry bodies, and decoding imports torch (ltc_cache.entries.entry);
the import happens on the first call, so a listing never pays for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..entries.kind_registry import KindView, ShowContext, handlers
from ..errors import EntryError, NoSuchEntry
from ..graph.graph_kind import describe_source
from ..store.disk import DiskStore
from .listing import EntryInfo

if TYPE_CHECKING:
    from ..entries.entry import Entry

__all__ = ["EntryProblem", "Progress", "VerifyReport", "decode_entry", "describe_source",
           "kind_view", "load_entry", "verify"]

# Progress callbacks get the number of items just done.
Progress = Callable[[int], None]


@dataclass(frozen=True)
class EntryProblem:
    key: str
    problem: str


def decode_entry(data: bytes, key: str, secret: bytes | None) -> Entry:
    """Entry bytes -> Entry; raises EntryError unless they are a good entry of ``key``."""
    from ..entries.entry import decode

    return decode(data, expected_key=key, secret=secret)


def load_entry(store: DiskStore, key: str, *, secret: bytes | None = None) -> Entry:
    """The decoded Entry of ``key``; raises KeyError or EntryError."""
    try:
        data = store.peek(key)
    except OSError as exc:
        raise EntryError(f"cannot read ({exc})", key) from None
    if data is None:
        raise NoSuchEntry(f"no entry with key {key}")
    return decode_entry(data, key, secret)


def kind_view(entry: Entry, listed: Sequence[EntryInfo], *, secret: bytes | None = None,
              with_ir: bool = True) -> KindView:
    """What ``show`` gives of ``entry`` besides the fields every entry has:
    its kind's view, which may name other entries of the listing ``listed``."""
    names = {e.key: e.graph_name for e in listed}
    return handlers(entry.kind).show(entry, ShowContext(secret, names.get, with_ir))


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
    stored under its own key, its IR parses, and what its kind checks
    (a plan's graphs rebuild; a program's or a fused library's signature
    holds where this user has the key that signs them; nothing is
    unpickled, no library loaded)."""
    from ..graph.torchscript_ir import parse_ir

    checked, problems = 0, []
    for key in keys:
        try:
            data = store.peek(key)
            if data is None:  # deleted meanwhile
                continue
            entry = decode_entry(data, key, secret)
            if entry.ir:
                parse_ir(entry.ir)
            handlers(entry.kind).verify(entry, secret, store.directory)
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
