"""A library's first-call verdict, kept so that later processes trust it.

A library's first call in a process runs the TorchScript function beside
it and compares their outputs (:func:`~.runner.mismatch`). Where they
matched, that verdict is stored as a small signed record beside the fused
entry, ``ltc_cache:fused-checked:<fused key>``, and a later process that
finds it holding runs the library alone from its first call.

A record rather than an entry or a field of the fused entry: the fused
entry (megabytes of library, written once by whoever compiled it) is never
rewritten, so a verdict can never race a recompile (``ltc-cache fuse
--retry``) and put an old library back; listings, ``stats``, ``verify`` and
eviction count entries, and a verdict is no library and no refusal. It is
a hint, as records are: a missing, unreadable, unsigned or foreign one only
means the comparison runs again (and stores a good verdict over it).

What is signed (HMAC-SHA256 under :func:`ltc_cache.signing.program_secret`,
the key that signs the library): the fused key, the graph key, the
library's own signature (which covers its bytes and what is read with
them) and the tolerance it was compared with. A verdict holds only for the
very library it was given for: one compiled again, or an older one put
back, has another signature, and its first call is compared again.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from typing import TYPE_CHECKING

import msgpack

from ...entries.wire import RECORD_PREFIX, read_record, write_record
from ...signing import program_secret
from ...store import Store
from .platform import FUSED_VERSION

if TYPE_CHECKING:
    from ...entries.entry_cache import EntryCache

__all__ = ["CHECKED_PREFIX", "RTOL", "holds_verdict", "keep_verdict", "store_verdict",
           "verdict_held", "verdict_key"]

logger = logging.getLogger("ltc_cache.fused")

CHECKED_PREFIX = RECORD_PREFIX + "fused-checked:"
CHECKED_FORMAT = "ltc_cache.fused-checked"
# The rule: outputs within 1e-5 relative of TorchScript's.
RTOL = 1e-5


def verdict_key(fused_digest: str) -> str:
    return CHECKED_PREFIX + fused_digest


def _sign(secret: bytes, fused_digest: str, graph_key: str, library_signature: bytes) -> bytes:
    signed = msgpack.packb([CHECKED_FORMAT, FUSED_VERSION, fused_digest, graph_key,
                            library_signature, RTOL], use_bin_type=True)
    return hmac.new(secret, signed, hashlib.sha256).digest()


def holds_verdict(store: Store, fused_digest: str, graph_key: str, library_signature: bytes,
                  secret: bytes) -> bool:
    """Whether a verdict that the library signed ``library_signature``
    (verified by the caller) matched TorchScript is stored under
    ``fused_digest`` and signed with ``secret``. False for anything else,
    never an error."""
    try:
        data = store.get(verdict_key(fused_digest))
    except Exception as exc:  # an unreadable record: compared again
        logger.debug("cannot read the verdict of %s: %s", fused_digest[:12], exc)
        return False
    record = read_record(data, CHECKED_FORMAT) if data else None
    if record is None:
        return False
    signature = record.get("hmac")
    if not isinstance(signature, bytes) or record.get("library_hmac") != library_signature:
        return False
    return hmac.compare_digest(signature, _sign(secret, fused_digest, graph_key,
                                                library_signature))


def store_verdict(store: Store, fused_digest: str, graph_key: str, library_signature: bytes,
                  secret: bytes) -> None:
    """Keep the verdict that the library matched TorchScript on its first
    call. A write that fails costs only a comparison in the next process."""
    fields = {"fused_key": fused_digest, "graph_key": graph_key,
              "library_hmac": library_signature, "rtol": RTOL,
              "hmac": _sign(secret, fused_digest, graph_key, library_signature)}
    try:
        store.put(verdict_key(fused_digest), write_record(CHECKED_FORMAT, fields))
    except Exception as exc:
        logger.debug("cannot write the verdict of %s: %s", fused_digest[:12], exc)


def verdict_held(cache: EntryCache, fused_digest: str, graph_key: str,
                 library_signature: bytes) -> bool:
    """:func:`holds_verdict` in ``cache``'s store, under its program key."""
    config = cache.config
    return cache.store is not None and holds_verdict(
        cache.store, fused_digest, graph_key, library_signature,
        program_secret(config.secret, config.directory))


def keep_verdict(cache: EntryCache, fused_digest: str, graph_key: str,
                 library_signature: bytes) -> None:
    """:func:`store_verdict` in ``cache``'s store, unless it is read-only."""
    if cache.store is None or cache.readonly:
        return
    config = cache.config
    store_verdict(cache.store, fused_digest, graph_key, library_signature,
                  program_secret(config.secret, config.directory))
