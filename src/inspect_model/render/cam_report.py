"""The ``cam`` report's text and rich rendering: ``render_text``/``render_rich`` format a
whole payload (the per-image entries are built by methods/cam/entries.py). Pure functions:
nothing is printed here.
"""

from __future__ import annotations

from typing import Any

from inspect_model.render import faithfulness as rf
from inspect_model.render.table import Column, one_line, plain_table, rich_table, warning_text
from inspect_model.render.labels import target_label

MAP_COLUMNS = (
    Column("Method"), Column("Layer"), Column("Target"), Column("Prob", "right"),
    Column("Raw min", "right"), Column("Raw max", "right"), Column("Note"),
)


def _num(v: Any) -> str:
    import math

    return "nan" if v is None or math.isnan(v) else f"{v:.4g}"


def _target(t: dict[str, Any]) -> str:
    return target_label(t)


def _map_rows(rec: dict[str, Any]) -> list[list[str]]:
    rows = []
    for m in rec["maps"]:
        note = "; ".join(m["warnings"]) if m["warnings"] else ("class-independent" if m["class_independent"] else "")
        prob = m["target"]["probability"]
        rows.append([m["method"], m["layer"], _target(m["target"]) + _dense_target(m),
                     "" if prob is None else f"{prob:.3f}", _num(m["raw_min"]), _num(m["raw_max"]), note])
    return rows


def _dense_target(m: dict[str, Any]) -> str:
    """A detection's box (in the picture's pixels, as ``--boxes`` takes them, when the picture
    is known), or a segmentation target's area and mask (issue 24)."""
    if "detection" in m:
        det = m["detection"]
        box = det.get("image_box") or det["box"]
        return " box [" + ", ".join(f"{v:.0f}" for v in box) + "]"
    if "segmentation" in m:
        seg = m["segmentation"]
        return f" {100 * seg['area_fraction']:.1f}% of pixels ({seg['mask_source']})"
    return ""


def _predictions(rec: dict[str, Any]) -> str:
    if "legend" in rec:
        return one_line(" | ".join(f"{_target(c)} {100 * c['area_fraction']:.1f}%" for c in rec["legend"][:8]))
    if rec.get("task") == "detection" and not rec["predictions"]:
        return "no detection at or above the threshold"
    return one_line(" | ".join(f"{_target(p)} {p['probability']:.3f}" for p in rec["predictions"]))


def _header(payload: dict[str, Any]) -> list[str]:
    layers = ", ".join(
        f"{lay['name']} ({lay['kind']} {'x'.join(str(g) for g in lay['grid'])}, {lay['channels']} ch)"
        for lay in payload["layers"])
    lines = [f"model: {one_line(payload['model'])}", f"layers: {one_line(layers)}",
             f"methods: {', '.join(payload['methods'])}   target: {payload['target']}"]
    if payload.get("fuse"):
        lines.append("fused: element-wise max of the layers' normalised maps")
    return lines


def render_text(payload: dict[str, Any]) -> str:
    """Plain text: a header, then per image its predictions and a table of its maps."""
    out = _header(payload)
    for rec in payload["images"]:
        out += ["", f"[{rec['index']}] {one_line(rec['image'])}", f"predicted: {_predictions(rec)}",
                plain_table(MAP_COLUMNS, _map_rows(rec))]
        for title, cols, rows in rf.image_tables(rec):
            out += [title, plain_table(cols, rows)]
    files = [f for f in payload.get("contact_sheets", [])]
    if files:
        out += ["", "contact sheets: " + ", ".join(files)]
    ev = payload.get("evaluation")
    if ev is not None:
        cols, rows = rf.average_table(ev)
        out += ["", rf.header(ev), f"average over {payload['image_count']} image(s):", plain_table(cols, rows)]
        if ev.get("plots"):
            out += ["curves: " + ", ".join(ev["plots"])]
    out += warning_text(payload)
    return "\n".join(out) + "\n"


def render_rich(payload: dict[str, Any]) -> list[Any]:
    parts: list[Any] = ["\n".join(_header(payload))]
    for rec in payload["images"]:
        # The predictions on a line of their own, as wide as the terminal: a table title
        # wraps at the table's width (issue 29: ~65 columns on a 160-column terminal).
        parts.append(f"\n[{rec['index']}] {one_line(rec['image'])}\npredicted: {_predictions(rec)}")
        parts.append(rich_table(MAP_COLUMNS, _map_rows(rec)))
        for title, cols, rows in rf.image_tables(rec):
            parts.append(rich_table(cols, rows, title=f"[{rec['index']}] {title}"))
    ev = payload.get("evaluation")
    if ev is not None:
        cols, rows = rf.average_table(ev)
        parts.append(rf.header(ev))
        parts.append(rich_table(cols, rows, title=f"average over {payload['image_count']} image(s)"))
    parts += warning_text(payload)
    return parts
