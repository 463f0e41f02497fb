"""Text tables: the same columns as a rich table (terminal) or plain aligned text (pipes).

Plain text has no colour codes and no box characters, and its column order is fixed, so
``grep``/``awk`` and golden files can rely on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Column:
    header: str
    align: str = "left"  # "left" or "right"


def plain_table(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> str:
    """Aligned plain text: two spaces between columns, a dashed rule under the header."""
    widths = [len(c.header) for c in columns]
    for r in rows:
        for i, cell in enumerate(r):
            widths[i] = max(widths[i], len(cell))

    def fmt(cells: Sequence[str]) -> str:
        parts = []
        for c, w, cell in zip(columns, widths, cells):
            parts.append(cell.rjust(w) if c.align == "right" else cell.ljust(w))
        return "  ".join(parts).rstrip()

    lines = [fmt([c.header for c in columns]), "  ".join("-" * w for w in widths)]
    lines.extend(fmt(r) for r in rows)
    return "\n".join(lines)


def rich_table(columns: Sequence[Column], rows: Sequence[Sequence[str]], title: str | None = None):
    from rich.table import Table

    t = Table(title=title, show_lines=False, header_style="bold")
    for c in columns:
        t.add_column(c.header, justify="right" if c.align == "right" else "left", overflow="fold")
    for r in rows:
        t.add_row(*r)
    return t


def human_count(n: float) -> str:
    """1234567 -> '1.23 M' (for totals lines)."""
    n = float(n)
    for unit, div in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f} {unit}"
    return f"{int(n)}"


def human_bytes(n: float) -> str:
    n = float(n)
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= div:
            return f"{n / div:.2f} {unit}"
    return f"{int(n)} B"


def thousands(n: int) -> str:
    return f"{n:,}"
