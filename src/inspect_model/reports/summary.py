"""The ``summary`` report's records; its schema (schemas/summary.json) is generated from them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from inspect_model.reports.base import Record, Warning_, fact, record

if TYPE_CHECKING:
    from inspect_model.methods.summary import SummaryResult, SummaryRow


@record
class SummaryLayer(Record):
    name: str
    type: str
    depth: int = fact(minimum=0)
    output_shapes: list[list[Annotated[int, {"minimum": 0}]]]
    calls: int = fact(optional=True, minimum=0)
    params: int = fact(minimum=0)
    params_recursive: int = fact(optional=True, minimum=0)
    trainable: Literal["yes", "no", "partial", ""] = fact(optional=True)
    macs: int = fact(minimum=0)
    macs_recursive: int = fact(optional=True, minimum=0)
    is_leaf: bool = fact(optional=True)
    folded: bool = fact(optional=True)
    status: Literal["ok", "not called", "failed"] = fact(optional=True)
    tied_to: str | None = fact(optional=True)
    unknown_cost_ops: list[str] = fact(optional=True)


@record
class SummaryReport(Record):
    """The ``summary`` report's body (the envelope is output/jsonout's)."""

    TITLE = "inspect-model summary report"
    model: str
    input_shapes: list[list[Annotated[int, {"minimum": 0}]]]
    dtype: str = fact(optional=True)
    device: str = fact(optional=True)
    total_params: int = fact(minimum=0)
    trainable_params: int = fact(minimum=0)
    frozen_params: int = fact(optional=True, minimum=0)
    total_macs: int = fact(minimum=0)
    param_bytes: int = fact(optional=True)
    buffer_bytes: int = fact(optional=True)
    activation_bytes: int = fact(optional=True)
    input_bytes: int = fact(optional=True)
    notes: list[str] = fact(optional=True)
    failed_layer: str | None = fact(optional=True)
    error: str | None = fact(optional=True)
    layers: list[SummaryLayer]
    warnings: list[Warning_]


def layer(row: SummaryRow) -> SummaryLayer:
    """The record of one row of the layer table."""
    return SummaryLayer(name=row.name, type=row.type, depth=row.depth,
                        output_shapes=[list(s) for s in row.output_shapes], calls=row.calls, params=row.params,
                        params_recursive=row.params_recursive, trainable=row.trainable, macs=row.macs,
                        macs_recursive=row.macs_recursive, is_leaf=row.is_leaf, folded=row.folded,
                        status=row.status, tied_to=row.tied_to, unknown_cost_ops=list(row.unknown_cost_ops))


def body(res: SummaryResult) -> dict[str, Any]:
    """The report's body for a :class:`~inspect_model.methods.summary.SummaryResult` (the
    envelope adds the warnings); its layers are :class:`SummaryLayer` records."""
    return {
        "model": res.model, "input_shapes": res.input_shapes, "dtype": res.dtype, "device": res.device,
        "total_params": res.total_params, "trainable_params": res.trainable_params,
        "frozen_params": res.frozen_params, "total_macs": res.total_macs, "param_bytes": res.param_bytes,
        "buffer_bytes": res.buffer_bytes, "activation_bytes": res.activation_bytes, "input_bytes": res.input_bytes,
        "notes": res.notes, "failed_layer": res.failed_layer, "error": res.error,
        "layers": [layer(r).to_dict() for r in res.rows],
    }
