"""What a command writes and how it ends: lines on stdout, errors on stderr,
JSON (one object for two tiers), aligned tables, a progress bar on a
terminal, the yes/no prompt; the exit statuses and UsageError."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TextIO

OK, PROBLEMS, USAGE = 0, 1, 2


def print_line(text: str = "") -> None:
    sys.stdout.write(text + "\n")


def print_error(text: str) -> None:
    sys.stderr.write(f"ltc-cache: {text}\n")


# Set when one command covers two tiers with --json: each tier's object is
# kept under its name and printed as one.
_json_sink: dict[str, Any] | None = None


def print_json(obj: Any) -> None:
    if _json_sink is not None:
        _json_sink[_json_sink["current"]] = obj
        return
    # Indented for a person at a terminal; compact for a program, since the
    # json module's C encoder is used only without indentation (5x faster
    # on a 10,000-entry listing).
    indent = 2 if sys.stdout.isatty() else None
    print_line(json.dumps(obj, indent=indent, default=str))


def gather_json() -> None:
    """From now on keep each :func:`print_json` object under the tier
    :func:`json_tier` names, until :func:`print_gathered_json`."""
    global _json_sink
    _json_sink = {}  # one JSON object, a member per tier


def gathering_json() -> bool:
    return _json_sink is not None


def json_tier(kind: str) -> None:
    """Objects written from now on belong to tier ``kind`` (when gathering)."""
    if _json_sink is not None:
        _json_sink["current"] = kind


def print_gathered_json() -> None:
    """Print the gathered objects as one, and stop gathering."""
    global _json_sink
    if _json_sink is not None:
        sink, _json_sink = _json_sink, None
        sink.pop("current", None)
        print_json(sink)


def counted(count: int, noun: str) -> str:
    """``1 entry``, ``2 entries``, ``0 internal records``."""
    if count == 1:
        return f"1 {noun}"
    return f"{count} {noun[:-1] + 'ies' if noun.endswith('y') else noun + 's'}"


def format_timestamp(timestamp: float | None) -> str:
    if not timestamp:
        return "-"
    return datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


class Progress:
    """A progress bar on stderr when it is a terminal, nothing when piped."""

    def __init__(self, label: str, total: int = 0, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.label = label
        self.total = total
        self.done = 0
        self.enabled = self.stream.isatty()
        self._drawn_at = 0.0

    def __call__(self, amount: int = 1) -> None:
        self.done += amount
        now = time.monotonic()
        if self.enabled and self.total and (now - self._drawn_at > 0.1 or self.done >= self.total):
            self._drawn_at = now
            filled = 30 * min(self.done, self.total) // self.total
            self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (30 - filled)}] "
                              f"{self.done}/{self.total}")
            self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled and self._drawn_at:
            self.stream.write("\r\033[K")
            self.stream.flush()


def table_lines(headers: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]
                ) -> list[str]:
    """Aligned lines, columns in ``right`` right-aligned. One format string
    for every row: a 10,000-row listing is drawn in C, not cell by cell."""
    lines = [headers, *rows]
    widths = [max(map(len, column)) for column in zip(*lines, strict=True)]
    template = "  ".join(f"{{:{'>' if i in right else '<'}{w}}}" for i, w in enumerate(widths))
    return [template.format(*cells).rstrip() for cells in lines]


def confirm(question: str, assume_yes: bool) -> bool:
    if assume_yes:
        return True
    sys.stdout.write(f"{question} [y/N] ")
    sys.stdout.flush()
    answer = sys.stdin.readline()
    if not sys.stdin.isatty():
        print_line()
    return answer.strip().lower() in ("y", "yes")
