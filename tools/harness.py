"""A Markdown table, as the benchmark scripts print them for BENCHMARKS.md."""

from __future__ import annotations


def table(rows: list[list[str]]) -> str:
    """Rows of cells (the first row the header) -> aligned Markdown."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
             for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)
