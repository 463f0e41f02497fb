"""The report on stdout of the built-in commands (each command's registry entry names its
renderer): a result carries data; this module turns it into text or rich tables.

Each renderer takes the result (``record``, ``payload``, ``warnings``, ``files``,
``to_dict()``); modules load on first use, so importing this one stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _lines(lines: list[str]) -> str:
    return "".join(f"{line}\n" for line in lines)


def _positions(r: Any, most: int = 16) -> list[str]:
    """``--text``: each chosen layer's mean token norm per position (the JSON has the rest)."""
    pos = r.payload.get("positions") if isinstance(r.payload, dict) else None
    if not pos:
        return []
    lines = [f"mean token norm per position ({pos['over']}):"]
    for row in pos["layers"]:
        vals = " ".join("-" if v is None else f"{v:.3g}" for v in row["norm"][:most])
        lines.append(f"  {row['name']} ({row['kind']}): {vals}" + (" ..." if len(row["norm"]) > most else ""))
    return lines


def activations_report(r: Any, rich: bool) -> Any:
    from inspect_model.render import activations as render

    fn = render.render_rich if rich else render.render_text
    out = fn(r.record, r.files, r.warnings, r.payload.get("drawn_layers"))
    return [*out, *_positions(r)] if rich else out + _lines(_positions(r))


def grads_report(r: Any, rich: bool) -> Any:
    from inspect_model.render import gradients as render
    from inspect_model.render.table import warning_text

    if r.view == "grads-jacobian":  # grads --of/--wrt
        return _jacobian(r, rich)
    warned = warning_text({"warnings": r.warnings})
    if rich:
        return [*render.render_rich(r.record), *_positions(r), *warned]
    return render.render_text(r.record) + _lines(_positions(r)) + _lines(warned)


def _jacobian(r: Any, rich: bool) -> Any:
    from inspect_model.render import gradients as render

    results = r.record.results
    return render.render_jacobian_rich(results) if rich else render.render_jacobian_text(results)


def cam_report(r: Any, rich: bool) -> Any:
    from inspect_model.render import cam_report as render

    return render.render_rich(r.to_dict()) if rich else render.render_text(r.to_dict())


def guided_report(r: Any, rich: bool) -> Any:
    from inspect_model.render import saliency as render

    return render.render_rich(r.to_dict()) if rich else render.render_text(r.to_dict())


def summary_report(r: Any, rich: bool) -> Any:
    from inspect_model.render import summary as render

    return render.render_rich(r.record) if rich else render.render_text(r.record)


def check_report(r: Any, rich: bool) -> Any:
    from inspect_model.render.table import clean

    lines = []
    failed = 0
    for c in r.record.checks:
        failed += not c.passed
        extra = f" ({c.detail})" if c.detail else ""
        lines.append(clean(f"{c.status.upper()}  {c.name}: {c.value_text} (expected {c.expected}){extra}"))
    lines.append(f"{len(r.record.checks) - failed} passed, {failed} failed")
    text = "\n".join(lines) + "\n"
    return [text] if rich else text


def models_report(r: Any, rich: bool) -> Any:
    from inspect_model.render.table import Column, plain_table

    items = [[m.name, m.family] for m in r.record.models]  # api/models.ModelsReport
    text = plain_table((Column("Model"), Column("Family")), items) + f"\n\n{len(items)} models\n"
    return [text] if rich else text


def _renderer(command: str) -> Callable[[Any, bool], Any]:
    """The renderer the command's registry entry names."""
    from inspect_model.registry import COMMANDS

    spec = COMMANDS.get(command)
    if spec is None or spec.renderer is None:
        raise KeyError(f"no renderer for the command '{command}'; name one in its registry entry")
    return spec.renderer


def result_text(command: str, result: Any) -> str:
    """The plain-text report of ``result`` (``report.txt``, and stdout when piped)."""
    return str(_renderer(command)(result, False))


def result_rich(command: str, result: Any) -> list[Any]:
    """The report as rich renderables (stdout on a terminal)."""
    return list(_renderer(command)(result, True))
