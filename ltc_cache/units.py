"""Human sizes and ages: parsing for configuration and flags, formatting for reports.

Sizes have one rule, everywhere (``LTC_CACHE_MAX_SIZE``, ``prune --max-size``,
``--filter size>...``): a whole number of bytes, or a number and a unit,
decimal ``B``, ``KB``, ``MB``, ``GB``, ``TB`` (powers of 1000) or binary
``KiB``, ``MiB``, ``GiB``, ``TiB`` (powers of 1024), spelled so (``kB`` too).
Anything else (``10K``, ``10Mb``, which is megabits, ``1.5`` bytes) is refused
rather than guessed at.
"""

from __future__ import annotations

import re
from decimal import Decimal

from .errors import BadArgument

__all__ = ["SIZE_RULE", "format_age", "format_size", "parse_age", "parse_size"]

SIZE_RULE = ("bytes, or a number with B, KB, MB, GB, TB (powers of 1000) "
             "or KiB, MiB, GiB, TiB (powers of 1024), e.g. 500MB, 2GB, 1.5GiB")
_SIZE_UNITS = {
    "B": 1, "kB": 10**3, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
}
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


def parse_size(text: str) -> int:
    """Parse ``"2GB"``, ``"512MiB"``, ``"1.5 GB"`` or ``"1024"`` into bytes (see SIZE_RULE)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2) not in {"", *_SIZE_UNITS}:
        raise BadArgument(f"not a size: {text!r} (give {SIZE_RULE})")
    number, unit = match.groups()
    # Decimal: 1.1KB is 1100 bytes exactly, not 1100.0000000000002.
    value = Decimal(number) * _SIZE_UNITS.get(unit, 1)
    if value != int(value):
        raise BadArgument(f"not a whole number of bytes: {text!r} (give {SIZE_RULE})")
    return int(value)


def parse_age(text: str) -> float:
    """Parse ``"30d"``, ``"12h"``, ``"90m"``, ``"2w"`` or plain seconds into seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdwy]?)\s*", text)
    if not match:
        raise BadArgument(f"not an age: {text!r} (give seconds, or a number with s, m, h, d, "
                         "w or y, e.g. 30d, 12h, 90m, 2w)")
    return float(match.group(1)) * _AGE_UNITS[match.group(2) or "s"]


def format_size(num_bytes: float) -> str:
    """``4200000`` -> ``"4.2 MB"`` (decimal units, as `du -h --si` and pip show them)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(num_bytes) < 1000 or unit == "TB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1000
    raise AssertionError("unreachable")


def format_age(seconds: float) -> str:
    """``259200`` -> ``"3 days ago"``."""
    if seconds < 60:
        return "just now" if seconds < 10 else f"{int(seconds)} seconds ago"
    for unit, length in (("year", 365 * 86400), ("week", 7 * 86400), ("day", 86400),
                         ("hour", 3600), ("minute", 60)):
        if seconds >= length:
            count = int(seconds // length)
            return f"{count} {unit}{'s' if count != 1 else ''} ago"
    raise AssertionError("unreachable")
