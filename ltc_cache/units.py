"""Human sizes and ages: parsing for configuration and flags, formatting for reports."""

from __future__ import annotations

import re

__all__ = ["format_age", "format_size", "parse_age", "parse_size"]

_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}


def parse_size(text: str) -> int:
    """Parse ``"2GB"``, ``"512MiB"``, ``"1.5 mb"`` or ``"1024"`` into bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match and match.group(2).lower()
    if not match or unit not in _SIZE_UNITS:
        raise ValueError(f"not a size: {text!r} (try e.g. 500MB, 2GB, 1GiB)")
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def parse_age(text: str) -> float:
    """Parse ``"30d"``, ``"12h"``, ``"90m"``, ``"2w"`` or plain seconds into seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdwy]?)\s*", text)
    if not match:
        raise ValueError(f"not an age: {text!r} (try e.g. 30d, 12h, 90m, 2w)")
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
