"""The ``summary`` report's records; its schema (schemas/summary.json) is generated from them."""

from __future__ import annotations

from typing import Annotated, Literal

from inspect_model.reports.base import Record, Warning_, fact, record


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
