"""One fused library's life in a process, for a graph entry and for a
plan's graph alike: the stored entry made usable (or dropped, or passed
over), its runner loaded into a :class:`~.runner.FusedFunction`, and that
function's first call judged against the path it stands in for.

- A library of a CPU this one is not (:class:`~ltc_cache.errors.NotForThisCpu`)
  is a miss here, kept for the CPUs it was built for and never rebuilt.
- A stored entry that is not a good library (another graph's, tampered
  with, malformed) is dropped, so the next process compiles it again.
- A refusal is passed over, with one warning unless its reason is no
  failure (not faster, data-dependent, ...).
- The first call is compared unless a verdict is kept: a match keeps one
  (:mod:`.verdicts`), a difference stores a refusal in the library's place
  and the path it stands in for runs from then on.

:class:`LibrarySlot` holds what differs between a graph's library and a
plan's: its key, what it is the library of, its counters and the words of
its messages.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...diagnostics import count_event, warn_once
from ...errors import EntryError, NotForThisCpu
from ...signing import program_secret
from .library_entries import Library, refusal_entry, usable_library, warn_not_for_this_cpu
from .runner import FusedFunction, mismatch
from .verdicts import RTOL, keep_verdict, verdict_held

if TYPE_CHECKING:
    from ...entries.entry import Entry
    from ...entries.entry_cache import EntryCache
    from ...entries.keys import CacheKey

__all__ = ["LibrarySlot", "SlotCounters"]


@dataclass(frozen=True)
class SlotCounters:
    """The ``stats()`` counters a slot bumps: a library loaded, its first
    call compared, a library refused on that call."""

    loads: str
    checks: str
    refused: str


@dataclass(frozen=True)
class LibrarySlot:
    """The library stored under ``key`` for ``of`` (a graph entry, or a
    plan's), which is the library of ``source`` (what
    :func:`~.platform.source_key` says of ``of``, worked out once by the
    caller), named ``name`` in messages; ``instead`` says what runs where it
    is not used ("replaying with TorchScript"), ``quiet`` the refusal
    reasons that are no failure."""

    cache: EntryCache
    key: CacheKey
    of: Entry
    source: str
    name: str
    counters: SlotCounters
    instead: str
    quiet: tuple[str, ...]
    refused_warning: str  # warn_once's key for a stored refusal

    def library(self, stored: Entry) -> Library | None:
        """The verified library of the fused entry ``stored``, or None
        where there is none to use here."""
        config = self.cache.config
        try:
            library = usable_library(stored, program_secret(config.secret, config.directory),
                                     self.source)
        except NotForThisCpu as exc:  # a miss here, never replaced: no rebuild loop
            warn_not_for_this_cpu(self.name, exc)
            return None
        except EntryError as exc:
            self.cache.drop_entry(self.key, str(exc), remade="compiled")
            return None
        if library is None:  # a refusal
            reason = str(stored.payload.get("reason", ""))
            if not reason.startswith(self.quiet):
                warn_once(self.refused_warning, f"no fused library for {self.name} "
                          f"({self.of.key[:12]}): {reason[:300]}; {self.instead} "
                          "(`ltc-cache show` and `ltc-cache fuse --retry`)")
        return library

    def function(self, stored: Entry, library: Library, runner: Any,
                 reference: Callable[..., Any], *, writes: Sequence[int] = ()) -> FusedFunction:
        """``runner`` (the library's, loaded) standing in for ``reference``:
        trusted where a verdict is kept, compared on its first call
        otherwise."""
        signature = bytes(stored.payload["hmac"])  # verified by library()
        count_event(self.counters.loads)
        checked = verdict_held(self.cache, self.key.digest, self.source, signature)
        return FusedFunction(runner, reference, aliases=library.aliases,
                             restride=library.restride, writes=writes, checked=checked,
                             check=lambda expected, got, error: self._checked(
                                 signature, expected, got, error))

    def _checked(self, signature: bytes, expected: Sequence[Any], got: Sequence[Any] | None,
                 error: Exception | None) -> bool:
        """The verdict on a library's first call (or a call where it
        raised): kept where its outputs match the reference's, refused for
        good where they differ or it raised."""
        count_event(self.counters.checks)
        problem = mismatch(expected, got, rtol=RTOL, error=error)
        if problem is None:
            keep_verdict(self.cache, self.key.digest, self.source, signature)
            return True
        count_event(self.counters.refused)
        warn_once(f"fused:{self.key.digest}", f"the fused library of {self.name} "
                  f"({self.of.key[:12]}) is not used: {problem}; {self.instead}")
        self.cache.store_entry(refusal_entry(self.key, self.of, f"on first use: {problem}"),
                               self.key)
        return False
