"""Text tables: the same columns as a rich table (terminal) or plain aligned text (pipes).

Plain text has no colour codes and no box characters, and its column order is fixed, so
``grep``/``awk`` and golden files can rely on it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# C0 controls (but not tab/newline handled by callers), DEL, C1 controls, the Unicode bidi
# overrides (an ESC sequence in a file name must not retitle or recolour a terminal), and
# lone surrogates: a file name that is not UTF-8 arrives surrogate-escaped (os.fsdecode),
# and no text file or terminal can encode those (issue 28).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_CONTROL_ALL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    if 0xDC80 <= c <= 0xDCFF:  # surrogateescape: the byte that was not UTF-8
        return f"\\x{c - 0xDC00:02x}"
    return f"\\x{c:02x}" if c < 256 else f"\\u{c:04x}"


def clean(text: Any) -> str:
    """``text`` safe for a terminal and a UTF-8 file: control characters (but newline and
    tab) and undecodable file-name bytes shown as ``\\xNN`` escapes, other lone surrogates
    and bidi overrides as ``\\uNNNN``. Human-readable output passes through this; JSON keeps
    the exact string (a byte that is not UTF-8 as its surrogate escape ``\\udcNN``)."""
    return _CONTROL.sub(_escape, str(text))


def one_line(text: Any) -> str:
    """A name (file, class, layer, model) as pictures, table cells and report lines show it:
    :func:`clean`, and newline, tab and carriage return escaped too, so it stays one line."""
    return _CONTROL_ALL.sub(_escape, str(text))


def warning_text(payload: Any) -> list[str]:
    """The report's warnings (a payload's, or a report record's), one line each, repeats
    collapsed (``text (x15)``)."""
    out = []
    for w in payload.get("warnings", []) if isinstance(payload, dict) else getattr(payload, "warnings", []):
        if hasattr(w, "message"):  # a Warning_ record
            out.append("warning: " + clean(w.message) + (f" (x{w.count})" if w.count > 1 else ""))
        elif isinstance(w, dict):
            out.append("warning: " + clean(w["message"]) + (f" (x{w['count']})" if w.get("count", 1) > 1 else ""))
        else:
            out.append(f"warning: {clean(w)}")
    return out


@dataclass(frozen=True)
class Column:
    header: str
    align: str = "left"  # "left" or "right"


def plain_table(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> str:
    """Aligned plain text: two spaces between columns, a dashed rule under the header."""
    rows = [[one_line(cell) for cell in r] for r in rows]
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
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=escape(one_line(title)) if title else None, show_lines=False, header_style="bold")
    for c in columns:
        t.add_column(c.header, justify="right" if c.align == "right" else "left", overflow="fold")
    for r in rows:
        t.add_row(*(escape(one_line(cell)) for cell in r))
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
