"""The ``cam`` report's text and rich rendering: ``render_text``/``render_rich`` format the
report's typed records (:class:`~inspect_model.reports.cam.CamReport`; a payload dict is read
into them first), built per image by methods/cam/entries.py. Pure functions: nothing is
printed here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inspect_model.render import faithfulness as rf
from inspect_model.render.labels import target_label
from inspect_model.render.table import Column, one_line, plain_table, rich_table, warning_text
from inspect_model.reports.base import ABSENT
from inspect_model.reports.cam import CamImage, CamMap, CamReport

MAP_COLUMNS = (
    Column("Method"), Column("Layer"), Column("Target"), Column("Prob", "right"),
    Column("Raw min", "right"), Column("Raw max", "right"), Column("Note"),
)


def report_of(payload: Mapping[str, Any] | CamReport) -> CamReport:
    """The report's records (a ``--json`` document or a result's payload is read into them)."""
    return payload if isinstance(payload, CamReport) else CamReport.from_dict(payload)


def _num(v: Any) -> str:
    import math

    return "nan" if v is None or math.isnan(v) else f"{v:.4g}"


def _map_rows(img: CamImage) -> list[list[str]]:
    rows = []
    for m in img.maps:
        note = "; ".join(m.warnings) if m.warnings else ("class-independent" if m.class_independent else "")
        prob = m.target.probability
        rows.append([m.method, m.layer, target_label(m.target) + _dense_target(m),
                     "" if prob is None else f"{prob:.3f}", _num(m.raw_min), _num(m.raw_max), note])
    return rows


def _dense_target(m: CamMap) -> str:
    """A detection's box (in the picture's pixels, as ``--boxes`` takes them, when the picture
    is known), or a segmentation target's area and mask (issue 24)."""
    if m.detection is not ABSENT:
        box = m.detection.image_box or m.detection.box
        return " box [" + ", ".join(f"{v:.0f}" for v in box) + "]"
    if m.segmentation is not ABSENT:
        seg = m.segmentation
        return f" {100 * seg.area_fraction:.1f}% of pixels ({seg.mask_source})"
    return ""


def _predictions(img: CamImage) -> str:
    if img.legend is not ABSENT:
        return one_line(" | ".join(f"{target_label(c)} {100 * c.area_fraction:.1f}%" for c in img.legend[:8]))
    if img.task == "detection" and not img.predictions:
        return "no detection at or above the threshold"
    return one_line(" | ".join(f"{target_label(p)} {p.probability:.3f}" for p in img.predictions))


def _header(report: CamReport) -> list[str]:
    layers = ", ".join(
        f"{lay.name} ({lay.kind} {'x'.join(str(g) for g in lay.grid)}, {lay.channels} ch)" for lay in report.layers)
    lines = [f"model: {one_line(report.model)}", f"layers: {one_line(layers)}",
             f"methods: {', '.join(report.methods)}   target: {report.target}"]
    if report.fuse:
        lines.append("fused: element-wise max of the layers' normalised maps")
    return lines


def render_text(payload: Mapping[str, Any] | CamReport) -> str:
    """Plain text: a header, then per image its predictions and a table of its maps."""
    report = report_of(payload)
    out = _header(report)
    for img in report.images:
        out += ["", f"[{img.index}] {one_line(img.image)}", f"predicted: {_predictions(img)}",
                plain_table(MAP_COLUMNS, _map_rows(img))]
        for title, cols, rows in rf.image_tables(img.to_dict()):
            out += [title, plain_table(cols, rows)]
    if report.contact_sheets:
        out += ["", "contact sheets: " + ", ".join(report.contact_sheets)]
    ev = report.evaluation
    if ev is not ABSENT:
        cols, rows = rf.average_table(ev.to_dict())
        out += ["", rf.header(ev.to_dict()), f"average over {report.image_count} image(s):", plain_table(cols, rows)]
        if ev.plots:
            out += ["curves: " + ", ".join(ev.plots)]
    out += warning_text(report)
    return "\n".join(out) + "\n"


def render_rich(payload: Mapping[str, Any] | CamReport) -> list[Any]:
    report = report_of(payload)
    parts: list[Any] = ["\n".join(_header(report))]
    for img in report.images:
        # The predictions on a line of their own, as wide as the terminal: a table title
        # wraps at the table's width (issue 29: ~65 columns on a 160-column terminal).
        parts.append(f"\n[{img.index}] {one_line(img.image)}\npredicted: {_predictions(img)}")
        parts.append(rich_table(MAP_COLUMNS, _map_rows(img)))
        for title, cols, rows in rf.image_tables(img.to_dict()):
            parts.append(rich_table(cols, rows, title=f"[{img.index}] {title}"))
    ev = report.evaluation
    if ev is not ABSENT:
        cols, rows = rf.average_table(ev.to_dict())
        parts.append(rf.header(ev.to_dict()))
        parts.append(rich_table(cols, rows, title=f"average over {report.image_count} image(s)"))
    parts += warning_text(report)
    return parts
