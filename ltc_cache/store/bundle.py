"""A portable bundle of entries: one file to bake a warm cache into an image.

A bundle is a msgpack stream, never pickle: a header map, one ``[key,
bytes]`` pair per entry (the raw stored bytes, so signatures and checksums
travel unchanged), and a trailer map with the count, so a truncated copy is
told apart from a short bundle. Reading checks the framing only; whoever
imports decodes each entry before trusting it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from ..errors import BundleError
from .base import MAX_ENTRY_BYTES

__all__ = ["BUNDLE_FORMAT", "BUNDLE_VERSION", "BundleHeader", "read_bundle",
           "write_bundle"]

# An exported bundle of entries, and the version of its layout.
BUNDLE_FORMAT = "ltc_cache.bundle"
BUNDLE_VERSION = 1
# One [key, bytes] pair: an entry, and room for its framing and key.
_MAX_RECORD_BYTES = MAX_ENTRY_BYTES + (1 << 20)


@dataclass(frozen=True)
class BundleHeader:
    version: int
    count: int  # entries announced; the trailer confirms them
    created: float


def write_bundle(path: Path, items: Iterable[tuple[str, bytes]], *, count: int) -> int:
    """Write ``items`` (key, entry bytes) to ``path`` atomically: a reader
    never sees half a bundle. Returns the number written; ``count`` is the
    number announced in the header (for progress), which may be higher if
    entries went away while exporting."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    packer = msgpack.Packer(use_bin_type=True)
    written = 0
    try:
        with open(tmp, "wb") as f:
            f.write(packer.pack({"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION,
                                 "count": count, "created": time.time()}))
            for key, data in items:
                f.write(packer.pack([key, bytes(data)]))
                written += 1
            f.write(packer.pack({"end": written}))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return written


def read_bundle(path: Path) -> tuple[BundleHeader, Iterator[tuple[str, bytes]]]:
    """Open a bundle: its header, and an iterator of (key, entry bytes) that
    raises BundleError where the stream is damaged or cut short."""
    f = open(path, "rb")  # noqa: SIM115 - closed by the iterator
    unpacker = msgpack.Unpacker(f, raw=False, max_buffer_size=_MAX_RECORD_BYTES)
    try:
        header = _header(next(unpacker, None))
    except Exception:
        f.close()
        raise
    return header, _records(f, unpacker)


def _header(obj: Any) -> BundleHeader:
    if not isinstance(obj, dict) or obj.get("format") != BUNDLE_FORMAT:
        raise BundleError("not an ltc_cache bundle")
    if obj.get("version") != BUNDLE_VERSION:
        raise BundleError(f"bundle version {obj.get('version')!r}; this ltc_cache reads "
                          f"{BUNDLE_VERSION}")
    try:
        return BundleHeader(BUNDLE_VERSION, int(obj["count"]), float(obj["created"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise BundleError(f"bad bundle header ({exc})") from None


def _records(f: Any, unpacker: msgpack.Unpacker) -> Iterator[tuple[str, bytes]]:
    with f:
        seen = 0
        try:
            for obj in unpacker:
                if isinstance(obj, dict) and "end" in obj:
                    if obj["end"] != seen:
                        raise BundleError(f"bundle trailer says {obj['end']} entries, "
                                          f"read {seen}")
                    return
                if (not isinstance(obj, list) or len(obj) != 2 or not isinstance(obj[0], str)
                        or not isinstance(obj[1], bytes)):
                    raise BundleError(f"record {seen + 1} is not a [key, bytes] pair")
                seen += 1
                yield obj[0], obj[1]
        except BundleError:
            raise
        except Exception as exc:  # msgpack raises several unrelated types
            raise BundleError(f"damaged after {seen} entries ({type(exc).__name__}: "
                              f"{exc})") from None
        raise BundleError(f"bundle cut short after {seen} entries (no trailer)")
