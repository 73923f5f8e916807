"""The bytes ltc_cache stores, as far as they can be read without torch.

An entry is a msgpack envelope ``{"format", "schema", "sha256", "body"}``
(plus ``"hmac"`` when entries are signed) around a msgpack body. The
envelope is read first, so an entry of another schema is recognised as such
even when its body changed shape, and the body is decoded only once its
checksum (and signature) holds. What the body means (tensors, the input
layout) is ``entry.py``'s, which needs torch; listing a cache, its
statistics and bundles need only what is here (and an entry's listing
summary, ``kind_registry.summarise``, which needs no torch either).

Besides entries, a store holds internal records: small msgpack maps tagged
with their format, under keys that are not 64 hex digits (``is_entry_key``).

Never pickle: everything here is data a new process can check before it
trusts it.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

import msgpack

from ..errors import EntryError
from ..store.base import MAX_ENTRY_BYTES, is_entry_key
from .kinds import KINDS

__all__ = [
    "FORMAT",
    "KINDS",
    "MAX_ENTRY_BYTES",
    "NAMES_FORMAT",
    "NAMES_PREFIX",
    "PLAN_FORMAT",
    "PROGRAM_FORMAT",
    "RECORD_PREFIX",
    "SCHEMA_VERSION",
    "SUPPORT_RECORD_FORMAT",
    "is_entry_key",
    "pack_envelope",
    "read_envelope",
    "read_record",
    "unpack",
    "write_record",
]

# An entry's envelope, and the layout version of its body: an entry of
# another schema is never decoded (the key hashes the schema too).
FORMAT = "ltc_cache.entry"
# 2: an entry's kind and its payload are fields of their own (1 kept them in
# its meta). A new schema makes new keys (graph/graph_keys.py hashes it): entries of the
# old one are never decoded, only misses, and ``ltc-cache prune --stale``
# removes them.
SCHEMA_VERSION = 2
# What an entry holds, KINDS: kinds.py's EntryKind, stored as its string.
# No entry is decoded, and no stored value read, past MAX_ENTRY_BYTES (the
# store's bound, store/base.py); no entry we write comes near it.

# Internal records: store keys under RECORD_PREFIX are never entry keys.
RECORD_PREFIX = "ltc_cache:"
NAMES_PREFIX = RECORD_PREFIX + "names:"  # + graph name: miss_reasons.py
NAMES_FORMAT = "ltc_cache.names"
# The op-support record (support.py).
SUPPORT_RECORD_FORMAT = "ltc_cache.op-support"
# The payloads of plan entries (plan.py) and program entries (program.py),
# each with a version of its own.
PLAN_FORMAT = "ltc_cache.plan"
PROGRAM_FORMAT = "ltc_cache.program"

def unpack(data: bytes) -> Any:
    """msgpack ``data``, bounded: msgpack limits every container and string
    by ``len(data)``, so a few bytes cannot claim gigabytes."""
    return msgpack.unpackb(data, raw=False, strict_map_key=True)


def _signature(secret: bytes, schema: int, body: bytes) -> bytes:
    # The schema is signed with the body: a signed entry cannot be passed
    # off as one of another layout.
    return hmac.new(secret, b"%s:%d\0%s" % (FORMAT.encode(), schema, body),
                    hashlib.sha256).digest()


def pack_envelope(body: bytes, *, secret: bytes | None = None) -> bytes:
    """The stored bytes of an entry whose body is ``body``; with ``secret``,
    signed with HMAC-SHA256."""
    envelope = {
        "format": FORMAT,
        "schema": SCHEMA_VERSION,
        "sha256": hashlib.sha256(body).digest(),
        "body": body,
    }
    if secret is not None:
        envelope["hmac"] = _signature(secret, SCHEMA_VERSION, body)
    return msgpack.packb(envelope, use_bin_type=True)


def read_envelope(data: bytes, *, secret: bytes | None = None) -> dict[str, Any]:
    """The checked envelope of an entry; raises EntryError. With ``secret``
    an entry must carry its HMAC-SHA256 signature."""
    if len(data) > MAX_ENTRY_BYTES:
        raise EntryError(f"{len(data)} bytes is over the {MAX_ENTRY_BYTES} byte bound")
    try:
        envelope = unpack(data)
    except Exception as exc:  # msgpack raises several unrelated types
        raise EntryError(f"not msgpack ({type(exc).__name__}: {exc})") from None
    if not isinstance(envelope, dict) or envelope.get("format") != FORMAT:
        raise EntryError("not an ltc_cache entry")
    if envelope.get("schema") != SCHEMA_VERSION:
        raise EntryError(f"schema {envelope.get('schema')!r}, this ltc_cache reads "
                         f"{SCHEMA_VERSION}")
    body = envelope.get("body")
    if not isinstance(body, bytes) or hashlib.sha256(body).digest() != envelope.get("sha256"):
        raise EntryError("checksum mismatch")
    if secret is not None:
        signature = envelope.get("hmac")
        if not isinstance(signature, bytes):
            raise EntryError("unsigned entry, and a secret is set (LTC_CACHE_SECRET)")
        if not hmac.compare_digest(signature, _signature(secret, SCHEMA_VERSION, body)):
            raise EntryError("signature mismatch: tampered with, or signed with another secret")
    return envelope


def write_record(record_format: str, fields: Mapping[str, Any]) -> bytes:
    """The stored bytes of an internal record of ``record_format``."""
    return msgpack.packb({"format": record_format, **fields}, use_bin_type=True)


def read_record(data: bytes, record_format: str) -> dict[str, Any] | None:
    """The fields of a record :func:`write_record` made with
    ``record_format``; None for any other bytes. A record is a hint that can
    be rebuilt: whoever reads one checks its fields and falls back when they
    do not hold."""
    try:
        obj = unpack(data)
    except Exception:  # msgpack raises several unrelated types
        return None
    if not isinstance(obj, dict) or obj.get("format") != record_format:
        return None
    return obj
