"""The ``grads`` report's records; its schema (schemas/grads.json) is generated from them."""

from __future__ import annotations

from typing import Annotated, Literal

from inspect_model.reports.base import Named, Record, Skipped, Warning_, fact, record
from inspect_model.reports.common import POSITIONS_DOC, Clip, Pair, Positions


@record
class GradStats(Record):
    """Statistics of a gradient tensor."""

    mean: float | None
    std: float | None
    min: float | None
    max: float | None
    abs_mean: float | None
    norm: float | None
    zero_fraction: float | None
    negative_fraction: float | None
    max_abs: float | None
    numel: int
    nan_count: int = fact(minimum=0)
    inf_count: int = fact(minimum=0)
    neg_inf_count: int = fact(
        doc="of inf_count, the -Inf values; the statistics of a tensor holding NaN or Inf are what "
            "torch computes on it (NaN, +-Inf: null here), never its finite part's",
        optional=True, minimum=0)


Stats = Annotated[GradStats | None, Named("stats")]  # null: no gradient reached it


@record
class GradsLayer(Record):
    key: str
    name: str
    type: str
    call_index: int = fact(minimum=0)
    output_shape: list[int] | None
    grad_wrt_output: Stats
    grad_wrt_input: Stats
    relative_norm: float | None
    gain: float | None
    reached: bool


@record
class GradsParam(Record):
    name: str
    shape: list[int]
    has_grad: bool
    norm: float | None
    mean: float | None
    std: float | None
    max_abs: float | None
    zero_fraction: float | None
    negative_fraction: float | None
    weight_norm: float | None
    grad_to_weight_ratio: float | None
    nan_count: int
    inf_count: int


@record
class GradsClipShare(Record):
    parameter: str
    share: float | None


@record
class GradClipping(Record):
    max_norm: float
    total_norm: float | None
    clip_coef: float | None
    scale: float | None
    clipped: bool
    dominant: list[GradsClipShare]


@record
class GradsCheck(Record):
    name: Literal["nan", "inf", "vanishing", "exploding"]
    status: Literal["pass", "fail", "skip"]
    passed: bool
    value: float | None
    threshold: float | None
    fail_on: bool
    detail: str
    layers: list[str]


@record
class TextTokens(Record):
    text: str
    tokens: list[str]


@record
class GradsImage(Record):
    image: str
    targets: list[int]
    objective: float | None
    input_grad_norm: float | None
    layer_grad_norms: dict[str, float | None]
    index: int = fact(minimum=0)
    clip: Clip = fact(optional=True)
    pair: Pair = fact(optional=True)
    text: TextTokens = fact(doc="--text: the text and its tokens as the tokenizer names them", optional=True)


@record
class Grads(Record):
    DEF = "grads"

    objective: str
    global_grad_norm: float | None
    output_grad_norm: float | None
    input_grad: Stats
    layers: list[GradsLayer]
    params: list[GradsParam]
    frozen_params: int = fact(minimum=0)
    clip: GradClipping | None
    checks: list[GradsCheck]
    first_nonfinite: str | None
    notes: list[str]
    image_count: int = fact(minimum=1)
    images: list[GradsImage]


@record
class JacobianPair(Record):
    of: str
    wrt: str
    images: list[str]
    of_shape: list[int]
    wrt_shape: list[int]
    vjp: Stats
    sample_norms: list[float | None]
    targets: list[list[int]] | None
    probes: int = fact(minimum=0)
    frobenius_sq: float | None
    frobenius_sq_se: float | None
    frobenius: float | None
    frobenius_se: float | None
    sample_frobenius_sq: list[float | None]


@record
class Jacobian(Record):
    DEF = "jacobian"

    jacobians: list[JacobianPair] = fact(minItems=1)


@record
class GradsReport(Record):
    """The ``grads`` report's body (the envelope is output/jsonout's)."""

    TITLE = "inspect-model grads report"
    SCHEMA = {"description": "mode 'grads': layer/parameter gradients and health checks; mode 'jacobian': d(of)/d(wrt) between layers (--of/--wrt).", "allOf": [{"if": {"properties": {"mode": {"const": "grads"}}}, "then": {"$ref": "#/$defs/grads"}}, {"if": {"properties": {"mode": {"const": "jacobian"}}}, "then": {"$ref": "#/$defs/jacobian"}}]}

    USES = (Grads, Jacobian)

    mode: Literal["grads", "jacobian"]
    warnings: list[Warning_]
    skipped: list[Skipped] = fact(optional=True)
    positions: Positions = fact(doc=POSITIONS_DOC, optional=True)
