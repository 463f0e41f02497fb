"""Render a :class:`SummaryResult` as table cells and totals lines (its JSON body is built
beside its record, :func:`inspect_model.reports.summary.body`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inspect_model.render.table import Column, human_bytes, human_count, one_line, plain_table, thousands

if TYPE_CHECKING:
    from inspect_model.methods.summary import SummaryResult, SummaryRow

COLUMNS = (
    Column("Layer"),
    Column("Type"),
    Column("Output shape"),
    Column("Params", "right"),
    Column("Trainable"),
    Column("MACs", "right"),
)


def _shape_text(row: SummaryRow) -> str:
    if row.status == "not called":
        return "--"
    if not row.output_shapes:
        return "-" if row.status != "failed" else "FAILED"
    shapes = [("x".join(str(d) for d in s) if s else "scalar") for s in row.output_shapes]
    text = ", ".join(shapes[:3]) + (f", ... ({len(shapes)} outputs)" if len(shapes) > 3 else "")
    if row.status == "failed":
        text = "FAILED"
    if row.calls > 1:
        text += f" (x{row.calls})"
    return text


def row_cells(row: SummaryRow) -> list[str]:
    label = row.name or "(model)"
    indent = "  " * max(row.depth - 1, 0) if row.name else ""
    name = indent + label.rsplit(".", 1)[-1] if row.depth > 1 else indent + label
    if row.depth > 1:
        # Show the full qualified name too: it is what --layers takes.
        name = indent + label
    params = "--" if row.params == 0 else thousands(row.params)
    if row.tied_to:
        params += f" (tied: {row.tied_to})"
    macs = "--" if row.macs == 0 else thousands(row.macs)
    if row.unknown_cost_ops:
        macs = "?"  # ran an op of unknown cost: not a counted zero
    return [name, row.type, _shape_text(row), params, row.trainable or "--", macs]


def totals_lines(res: SummaryResult) -> list[str]:
    shapes = ", ".join("x".join(str(d) for d in s) for s in res.input_shapes)
    lines = [
        f"Input: {shapes} ({res.dtype})",
        f"Total params: {thousands(res.total_params)} ({human_count(res.total_params)})",
        f"Trainable params: {thousands(res.trainable_params)}",
        f"Frozen params: {thousands(res.frozen_params)}",
        f"Total MACs: {thousands(res.total_macs)} ({human_count(res.total_macs)}MACs)",
        f"Parameter memory: {human_bytes(res.param_bytes)}"
        + (f" (+ {human_bytes(res.buffer_bytes)} buffers)" if res.buffer_bytes else ""),
        f"Activation memory (forward, estimate): {human_bytes(res.activation_bytes)}",
        f"Input memory: {human_bytes(res.input_bytes)}",
        f"Computed on: {res.device}",
    ]
    lines.extend(f"Note: {n}" for n in res.notes)
    if res.error:
        where = f" in layer '{res.failed_layer}'" if res.failed_layer else ""
        lines.append(f"Forward pass FAILED{where}: {res.error}")
    return lines


def render_text(res: SummaryResult) -> str:
    body = plain_table(COLUMNS, [row_cells(r) for r in res.rows])
    return f"Model: {one_line(res.model)}\n{body}\n\n" + "\n".join(totals_lines(res)) + "\n"


def render_rich(res: SummaryResult) -> list[Any]:
    from inspect_model.render.table import rich_table

    t = rich_table(COLUMNS, [row_cells(r) for r in res.rows], title=f"Model: {res.model}")
    return [t, "\n".join(totals_lines(res))]
