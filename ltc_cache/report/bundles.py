"""``export`` and ``import``: entries to and from one portable bundle file
(the file format is store/bundle.py's)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..entries.wire import is_entry_key
from ..errors import BundleError, EntryError
from ..store.bundle import read_bundle, write_bundle
from ..store.disk import DiskStore
from .show_and_verify import EntryProblem, Progress, decode_entry

__all__ = ["ImportReport", "export_bundle", "import_bundle"]


@dataclass(frozen=True)
class ImportReport:
    added: tuple[str, ...]
    present: tuple[str, ...]  # already in the cache: left as they are
    rejected: tuple[EntryProblem, ...]
    other_torch: int  # added entries of another torch version (they will not be hit)
    error: str | None = None  # the bundle was damaged here; what came before is in

    @property
    def ok(self) -> bool:
        return not self.rejected and self.error is None


def export_bundle(store: DiskStore, keys: Sequence[str], path: Path, *,
                  progress: Progress | None = None) -> int:
    """Write the stored bytes of ``keys`` to a bundle at ``path``; returns
    how many were written."""
    def items() -> Iterator[tuple[str, bytes]]:
        for key in keys:
            data = store.peek(key)
            if progress:
                progress(1)
            if data is not None:  # deleted meanwhile
                yield key, data

    return write_bundle(Path(path), items(), count=len(keys))


def import_bundle(store: DiskStore, path: Path, *, secret: bytes | None = None,
                  progress: Progress | None = None,
                  on_header: Callable[[int], None] | None = None) -> ImportReport:
    """Add the entries of a bundle that decode under their own key (and
    signature); raises BundleError where ``path`` is not a bundle at all.
    ``on_header`` gets the number of entries the bundle announces."""
    import torch

    header, records = read_bundle(Path(path))
    if on_header:
        on_header(header.count)
    existing = set(store.keys())
    added, present, rejected, other_torch, error = [], [], [], 0, None
    try:
        for key, data in records:
            if progress:
                progress(1)
            if not is_entry_key(key):
                rejected.append(EntryProblem(key, "not an entry key"))
                continue
            if key in existing:
                present.append(key)
                continue
            try:
                entry = decode_entry(data, key, secret)
            except EntryError as exc:
                rejected.append(EntryProblem(key, str(exc)))
                continue
            store.put(key, data)
            existing.add(key)
            added.append(key)
            other_torch += entry.meta.get("torch_version") != torch.__version__
    except BundleError as exc:
        error = str(exc)
    return ImportReport(tuple(added), tuple(present), tuple(rejected), other_torch, error)
