"""The ``check`` report's records; its schema (schemas/check.json) is generated from them."""

from __future__ import annotations

from typing import Any, Literal

from inspect_model.reports.base import Record, Warning_, fact, record


@record
class CheckCheck(Record):
    name: str
    status: Literal["pass", "fail"]
    passed: bool
    value: Any = fact(doc="what was measured: a number, an output shape as a list of ints, or a boolean")
    threshold: float | None = fact(
        doc="the one numeric bound the value must not exceed (as grads reports it), else null")
    expected: Any = fact(
        doc="what passes: {min, max} bounds (null: open) for numeric checks, or the exact value (a "
            "shape as a list of ints, true)",
        schema={"oneOf": [{"type": "object", "required": ["min", "max"], "properties": {"min": {"type": ["number", "null"]}, "max": {"type": ["number", "null"]}}, "additionalProperties": False}, {"type": "array", "items": {"type": "integer"}}, {"type": "boolean"}]})
    expected_text: str = fact(doc="the expectation as report.txt prints it, e.g. '<= 0.5' or '10..20'")
    detail: str = fact(optional=True)


@record
class CheckReport(Record):
    """The ``check`` report's body (the envelope is output/jsonout's)."""

    TITLE = "inspect-model check report"
    model: str
    passed: bool
    checks: list[CheckCheck]
    warnings: list[Warning_]
