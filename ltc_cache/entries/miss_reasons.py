"""Explaining a miss: which key parts differ from the nearest entry of the
same graph name.

One small internal record per graph name, ``ltc_cache:names:<name>``, holds
the key parts of its last few entries, so that an explanation is one read
rather than a scan of every entry. It is only a hint: a missing or corrupt
record explains nothing and breaks nothing.
"""

from __future__ import annotations

import logging

from ..store import Store
from .keys import CacheKey, differing_parts
from .wire import NAMES_FORMAT, NAMES_PREFIX, read_record, write_record

__all__ = ["explain_miss", "remember_name"]

logger = logging.getLogger("ltc_cache.names")

_KEPT = 8


def _read(store: Store, graph_name: str) -> list[dict[str, str]]:
    try:
        data = store.get(NAMES_PREFIX + graph_name)
    except Exception:  # an unreadable record: no hint
        return []
    obj = read_record(data, NAMES_FORMAT) if data else None
    if obj is None:  # a missing or corrupt record: no hint
        return []
    keys = obj.get("keys")
    if not isinstance(keys, list):
        return []
    return [k for k in keys if isinstance(k, dict)
            and all(isinstance(n, str) and isinstance(v, str) for n, v in k.items())]


def explain_miss(store: Store, key: CacheKey, graph_name: str) -> str:
    recent = _read(store, graph_name)
    if not recent:
        return "no entry of that name yet"
    nearest = min((differing_parts(key.parts, parts) for parts in recent), key=len)
    return f"differs from the nearest entry of that name in {', '.join(nearest) or 'nothing'}"


def remember_name(store: Store, key: CacheKey, graph_name: str) -> None:
    recent = [p for p in _read(store, graph_name) if p != dict(key.parts)]
    recent = [*recent, dict(key.parts)][-_KEPT:]
    try:
        store.put(NAMES_PREFIX + graph_name, write_record(NAMES_FORMAT, {"keys": recent}))
    except Exception as exc:
        logger.debug("cannot write the names record of %s: %s", graph_name, exc)
