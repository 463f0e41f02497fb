"""The ``attention`` report's records; its schema (schemas/attention.json) is generated from them."""

from __future__ import annotations

from typing import Annotated, Any

from inspect_model.reports.base import Record, Skipped, Warning_, fact, record
from inspect_model.reports.faithfulness import Evaluation, MapEvaluation
from inspect_model.reports.common import ImageText, OBJECTIVE_DOC, Method


@record
class AttentionImageTarget(Record):
    class_: int = fact(key="class")
    label: str | None
    probability: float | None
    objective: bool = fact(optional=True, doc=OBJECTIVE_DOC)


AttentionImageMapTarget = AttentionImageTarget  # a map's target is its image's


@record
class AttentionImageMap(Record):
    method: Method
    layer: str
    target: AttentionImageMapTarget | None
    peak_cell: list[int] = fact(optional=True, minItems=2, maxItems=2)
    max: float | None
    min: float | None
    heads: list[str] = fact(optional=True)
    query: str = fact(optional=True)
    files: dict[str, str | None]
    grid: list[int] = fact(optional=True, minItems=2, maxItems=2)
    rank: int = fact(optional=True)
    evaluation: MapEvaluation = fact(doc="--evaluate only: this map's faithfulness.", optional=True)
    values: list[Annotated[Any, {"anyOf": [{"type": "number"}, {"type": "array", "items": {"type": "number"}}]}]] = fact(
        doc="--text: per-token values (rollout, grad-rollout: the query token's row; legrad: "
            "relevance); raw: one row per head shown, the query token's attention",
        optional=True)
    peak_token: int = fact(
        doc="--text: the token with the largest value, the query token aside",
        optional=True)


AttentionImageText = ImageText


@record
class AttentionImage(Record):
    index: int
    image: str
    target: AttentionImageTarget | None
    maps: list[AttentionImageMap]
    files: dict[str, str | None]
    text: AttentionImageText = fact(
        doc="--text: the text and its tokens as the tokenizer names them",
        optional=True)


@record
class AttentionReport(Record):
    """The ``attention`` report's body (the envelope is output/jsonout's)."""

    TITLE = "inspect-model attention report"
    model: str
    methods: list[Method]
    layers: list[str] = fact(doc="attention layers, in call order")
    heads: int
    tokens: int
    prefix_tokens: int
    grid: Any = fact(
        doc="the patch grid (rows, cols); empty for text",
        schema={"anyOf": [{"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}, {"type": "array", "maxItems": 0}]})
    passes_per_batch: dict[str, int] = fact(optional=True)
    images: list[AttentionImage]
    image_count: int
    warnings: list[Warning_]
    skipped: list[Skipped]
    windowed: bool = fact(doc="the raw layers attend within windows (Swin/MaxViT)", optional=True)
    evaluation: Evaluation = fact(doc="--evaluate only: settings, cost and the methods ranked on average.", optional=True)
    text: bool = fact(doc="--text: token maps of texts", optional=True)
    causal: bool = fact(doc="--text: the model's attention is causal (a decoder)", optional=True)
    cam_layer: str | None = fact(
        doc="the layer of the CAM-family maps (--cam-layer), null without them",
        optional=True)
    skipped_methods: dict[str, str] = fact(
        doc="Methods asked for and not run, with why: on a head-less model the methods that explain a"
            " score, unless an objective is named (issue 42).",
        optional=True)
