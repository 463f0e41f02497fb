"""Boxes for the pointing and energy games (``cam --evaluate --boxes FILE``).

A boxes file gives, per image, boxes ``x0, y0, x1, y1`` in the original image's pixels
(left, top, right, bottom). JSON: ``{"cat.jpg": [[x0, y0, x1, y1], ...]}`` (one box may be
given bare) or a list of ``{"image": "cat.jpg", "box": [x0, y0, x1, y1]}``. CSV: rows
``image,x0,y0,x1,y1``, with or without that header. An image is named by its path as given
on the command line, or by its file name. For a detector or a segmenter a box may name a
class (index or name): a sixth CSV field ``label``, or ``{"box": [...], "label": "cat"}`` in
JSON (:func:`load_labelled_boxes`).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from inspect_model.errors import InputError
from inspect_model.loading.parsing import check_depth, read_bounded

Box = tuple[float, float, float, float]


def load_boxes(path: str | Path) -> dict[str, list[Box]]:
    """The boxes of ``path`` (JSON or CSV, by content), per image name."""
    return {k: [b for b, _ in v] for k, v in load_labelled_boxes(path).items()}


def load_labelled_boxes(path: str | Path) -> dict[str, list[tuple[Box, str | None]]]:
    """The boxes of ``path`` with the class each names (None when it names none)."""
    p = Path(path)
    try:
        text = read_bounded(p, f"boxes file '{p}'").decode("utf-8")
    except FileNotFoundError as exc:
        raise InputError(f"boxes file '{p}' does not exist") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"boxes file '{p}' cannot be read: {exc}") from exc
    out: dict[str, list[tuple[Box, str | None]]] = {}
    if text.lstrip().startswith(("{", "[")):
        try:
            doc = check_depth(json.loads(text), f"boxes file '{p}'")
        except RecursionError:
            raise InputError(f"boxes file '{p}' nests lists or objects too deeply to read") from None
        except json.JSONDecodeError as exc:
            raise InputError(f"boxes file '{p}' is not valid JSON: {exc.msg} at line {exc.lineno}") from exc
        items: list[tuple[Any, Any]]
        if isinstance(doc, dict):
            items = []
            for name, val in doc.items():
                bare = isinstance(val, list) and len(val) == 4 and all(not isinstance(v, list) for v in val)
                items += [(name, val)] if bare else [(name, b) for b in (val if isinstance(val, list) else [val])]
        elif isinstance(doc, list):
            items = [(d.get("image"), d.get("box")) if isinstance(d, dict) else (None, d) for d in doc]
        else:
            raise InputError(f"boxes file '{p}': expected an object or a list of objects")
        for i, (name, box) in enumerate(items):
            if not isinstance(name, str) or not name:
                raise InputError(f"boxes file '{p}': entry {i + 1} names no image")
            label = None
            if isinstance(box, dict):  # {"box": [...], "label": ...} under an image name
                label, box = box.get("label"), box.get("box")
            elif isinstance(doc, list) and isinstance(doc[i], dict):
                label = doc[i].get("label")
            where = f"boxes file '{p}', image '{name}'"
            out.setdefault(name, []).append((_box(box, where), None if label is None else str(label)))
    else:
        for n, row in _csv_rows(text, p):
            if not row or not "".join(row).strip() or row[0].strip().startswith("#"):
                continue
            if n == 1 and row[0].strip().lower() in ("image", "path", "file"):
                continue
            if len(row) not in (5, 6):
                raise InputError(f"boxes file '{p}', line {n}: expected image,x0,y0,x1,y1, got {len(row)} fields "
                                 "(a sixth may name the box's class)")
            label = row[5].strip() or None if len(row) == 6 else None
            out.setdefault(row[0].strip(), []).append((_box(row[1:5], f"boxes file '{p}', line {n}"), label))
    if not out:
        raise InputError(f"boxes file '{p}' holds no boxes")
    return out


def _csv_rows(text: str, p: Path) -> Any:
    """The CSV rows of ``text`` with their line numbers; a malformed row (a field over the
    csv module's limit, a NUL) is one input error naming the line (issue 41)."""
    reader = csv.reader(text.splitlines())
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise InputError(f"boxes file '{p}', line {reader.line_num}: not valid CSV ({exc}); "
                             "give image,x0,y0,x1,y1 per line") from exc
        yield reader.line_num, row


def _box(value: Any, where: str) -> Box:
    try:
        x0, y0, x1, y1 = (float(v) for v in value)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{where}: a box is four numbers x0,y0,x1,y1, got {value!r}") from exc
    if not all(math.isfinite(v) for v in (x0, y0, x1, y1)):
        raise InputError(f"{where}: box {value!r} is not finite")
    if x1 <= x0 or y1 <= y0:
        raise InputError(f"{where}: box {[x0, y0, x1, y1]} is empty (needs x0 < x1 and y0 < y1)")
    return x0, y0, x1, y1


def match_boxes(boxes: dict[str, list[Box]], names: list[str], source: str) -> dict[str, list[Box]]:
    """Boxes per input name; an image of the file that is not among the inputs is an error."""
    out: dict[str, list[Box]] = {}
    by_base: dict[str, list[str]] = {}
    for n in names:
        by_base.setdefault(Path(n).name, []).append(n)
    for key, bs in boxes.items():
        if key in names:
            hit = key
        elif Path(key).name == key and len(by_base.get(key, [])) == 1:
            hit = by_base[key][0]
        else:
            resolved = [n for n in names if _same(n, key)]
            if not resolved:
                shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
                raise InputError(f"boxes file '{source}' names image '{key}', which is not among the inputs "
                                 f"({shown}); remove it or add that image")
            hit = resolved[0]
        out.setdefault(hit, []).extend(bs)
    return out


def _same(a: str, b: str) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def check_inside(boxes: list[Box], width: int, height: int, name: str, source: str) -> None:
    """Each box must lie in the ``width`` x ``height`` image."""
    for x0, y0, x1, y1 in boxes:
        if x0 < 0 or y0 < 0 or x1 > width or y1 > height:
            raise InputError(f"boxes file '{source}': box [{x0:g}, {y0:g}, {x1:g}, {y1:g}] lies outside image "
                             f"'{name}' ({width}x{height} pixels)")
