"""Plain-text tables for the reports the commands print (`verify`, `compare`)."""

from __future__ import annotations

from collections.abc import Sequence


def text_table(rows: Sequence[Sequence[str]], gap: str = "  ") -> list[str]:
    """The rows as aligned lines, the first row a header underlined with dashes."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [gap.join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, gap.join("-" * w for w in widths))
    return lines
