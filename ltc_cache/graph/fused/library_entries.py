"""Fused libraries as cache entries, signed because they are code.

A fused entry (kind ``fused``) sits beside the graph entry it was compiled
from, under :func:`~.platform.fused_key` of that entry's
:func:`~.platform.source_key` (a graph's content, which identical layers
share; a plan's key), its ``graph_key``. Its payload
holds the shared library's bytes and what a replay needs to use it in
place of the TorchScript function:

- ``aliases``: outputs that the TorchScript function returns as views of
  an input or of another output (``[output, "in"|"out", index, size,
  stride, offset]``, the offset from the base's own); a library returns
  copies, so the replay takes those views itself;
- ``restride``: the outputs the library lays out otherwise than the
  TorchScript function (``[output, size, stride]``, TorchScript's), which
  the replay copies into that layout;
- ``isa``: every vector feature the library needs (Inductor's ISA, with
  AVX-512 BF16 and AMX FP16 where it used them: :mod:`.cpu_isa`), checked
  against the CPU before the library is loaded;
- the timings of both tiers on the graph when it was built, and the
  compile's seconds, for listings and for the rule that a library is only
  stored where it is faster.

A library that cannot be used (slower, a failed or timed-out compile, no
compiler, outputs that differ) is stored as a refusal: the same kind with a
``reason`` and no library, so no process compiles it again.

The signature (HMAC-SHA256 under :func:`ltc_cache.signing.program_secret`)
covers the key, the graph key, the library and everything read with it.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any, NamedTuple

import msgpack

from ...diagnostics import warn_once
from ...entries.entry import Entry, new_meta
from ...entries.keys import CacheKey
from ...entries.kinds import EntryKind
from ...errors import EntryError, NotForThisCpu
from .cpu_isa import missing_features, unknown_words
from .platform import FUSED_VERSION, source_key

__all__ = ["DATA_DEPENDENT", "FUSED_FORMAT", "NOT_FASTER", "Library", "fused_entry", "library_of",
           "refusal_entry", "stored_library", "usable_library", "warn_not_for_this_cpu"]

FUSED_FORMAT = "ltc_cache.fused"
# How a refusal's reason starts where the library was built but was slower,
# and where the graph reads a tensor's value as a number (a library could
# only bake in the value it was traced with): refusals that are no failure.
NOT_FASTER = "not faster"
DATA_DEPENDENT = "data-dependent"


class Library(NamedTuple):
    """What a fused entry holds: the library and what a replay needs to use it."""

    data: bytes
    isa: str
    aliases: list[list[Any]]
    restride: list[list[Any]]


def _sign(secret: bytes, key: str, graph_key: str, library: bytes, isa: str,
          aliases: Any, restride: Any) -> bytes:
    signed = msgpack.packb([FUSED_FORMAT, FUSED_VERSION, key, graph_key, library, isa, aliases,
                            restride], use_bin_type=True)
    return hmac.new(secret, signed, hashlib.sha256).digest()


def fused_entry(key: CacheKey, graph: Entry, *, library: bytes, isa: str,
                aliases: list[list[Any]], restride: list[list[Any]], secret: bytes,
                stats: Mapping[str, Any]) -> Entry:
    """The entry of ``graph``'s library; ``stats``: compile seconds,
    compiler, both tiers' timings (shown by ``ltc-cache show``)."""
    source = source_key(graph)
    payload = {
        "format": FUSED_FORMAT, "version": FUSED_VERSION, "graph_key": source, "of": graph.kind,
        "library": library, "isa": isa, "aliases": aliases, "restride": restride,
        "hmac": _sign(secret, key.digest, source, library, isa, aliases, restride),
        "library_sha256": hashlib.sha256(library).hexdigest(), **stats,
    }
    return Entry(key.digest, "", (), (), (), _meta(key, graph), kind=EntryKind.FUSED,
                 payload=payload)


def refusal_entry(key: CacheKey, graph: Entry, reason: str,
                  stats: Mapping[str, Any] | None = None) -> Entry:
    """Why ``graph`` has no library on machines of ``key``: kept so that no
    process tries again (``ltc-cache fuse --retry`` does)."""
    payload = {"format": FUSED_FORMAT, "version": FUSED_VERSION, "graph_key": source_key(graph),
               "of": graph.kind, "reason": reason[:2000], **(stats or {})}
    return Entry(key.digest, "", (), (), (), _meta(key, graph), kind=EntryKind.FUSED,
                 payload=payload)


def _meta(key: CacheKey, graph: Entry) -> dict[str, Any]:
    return new_meta(graph_name=graph.graph_name, node_count=int(graph.meta.get("node_count", 0)),
                    graph_hash=str(graph.meta.get("graph_hash", "")), key_parts=key.parts)


def stored_library(entry: Entry, graph_key: str, *, check_sha256: bool = True
                   ) -> Library | None:
    """The library a fused entry holds, checked for form but not for its
    signature (what ``ltc-cache verify`` can check without a key); None for
    a refusal. Raises EntryError for another format, a library of another
    graph, a malformed one, or (``check_sha256``) one whose bytes differ
    from their recorded sha256."""
    p = entry.payload
    if entry.kind != EntryKind.FUSED or p.get("format") != FUSED_FORMAT \
            or p.get("version") != FUSED_VERSION:
        raise EntryError("not a fused library of this ltc_cache", entry.key)
    if p.get("graph_key") != graph_key:
        raise EntryError(f"fused library of graph {str(p.get('graph_key'))[:12]}, "
                         f"looked up for {graph_key[:12]}", entry.key)
    if "library" not in p:
        if not isinstance(p.get("reason"), str):
            raise EntryError("fused refusal: malformed (no reason)", entry.key)
        return None
    library, isa = p.get("library"), p.get("isa")
    aliases, restride = p.get("aliases"), p.get("restride")
    if not isinstance(library, bytes) or not isinstance(isa, str) \
            or not isinstance(aliases, list) or not isinstance(restride, list):
        raise EntryError("fused library: malformed", entry.key)
    if check_sha256:
        _check_sha256(entry, library)
    return Library(library, isa, aliases, restride)


def _check_sha256(entry: Entry, library: bytes) -> None:
    # Not signed, but shown by `ltc-cache show`: one that differs was changed since.
    if entry.payload.get("library_sha256") != hashlib.sha256(library).hexdigest():
        raise EntryError("fused library: its bytes do not match its recorded sha256",
                         entry.key)


def library_of(entry: Entry, secret: bytes, graph_key: str) -> Library | None:
    """The library of a fused entry whose signature holds under ``secret``;
    None for a refusal. Raises EntryError for anything else: what
    :func:`stored_library` refuses, unsigned, tampered with."""
    # The signature covers the bytes: their sha256 is hashed only to say
    # what a signature that fails to hold was failed by (a library's
    # bytes are hashed three times on a warm load already,
    # docs/torch/aot-inductor.md#loading-a-library-reads-its-bytes-five-times).
    library = stored_library(entry, graph_key, check_sha256=False)
    if library is None:
        return None
    signature = entry.payload.get("hmac")
    if not isinstance(signature, bytes):
        _check_sha256(entry, library.data)
        raise EntryError("fused library: unsigned", entry.key)
    if not hmac.compare_digest(signature, _sign(secret, entry.key, graph_key, *library)):
        _check_sha256(entry, library.data)
        raise EntryError("fused library: signature mismatch (tampered with, or signed with "
                         "another key)", entry.key)
    return library


def warn_not_for_this_cpu(name: str, exc: NotForThisCpu) -> None:
    """Say once a process that a library (of the graph or plan ``name``) is
    not used on this CPU: it stays stored for the CPUs that run it."""
    warn_once("fused-cpu", f"the fused library of {name} is not used on this CPU ({exc}); it "
              "runs without it, and the library stays for the CPUs it was built for")


def usable_library(entry: Entry, secret: bytes, graph_key: str) -> Library | None:
    """:func:`library_of`, refused (:class:`~ltc_cache.errors.NotForThisCpu`)
    where this CPU lacks a vector feature the library needs, or the library
    names one ltc_cache does not know (never guessed at)."""
    library = library_of(entry, secret, graph_key)
    if library is None:
        return None
    unknown = unknown_words(library.isa)
    if unknown:
        raise NotForThisCpu(f"built for {library.isa}, whose {' '.join(unknown)} ltc_cache "
                            "does not know", entry.key)
    missing = missing_features(library.isa)
    if missing:
        raise NotForThisCpu(f"built for {library.isa}; this CPU lacks {' '.join(missing)}",
                            entry.key)
    return library
