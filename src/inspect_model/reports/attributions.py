"""The ``attributions`` report's records; its schema (schemas/attributions.json) is generated from them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from inspect_model.reports.base import Record, Skipped, Warning_, fact, record
from inspect_model.reports.faithfulness import Evaluation, MapEvaluation
from inspect_model.reports.common import MapFrames, OBJECTIVE_DOC, Clip, Method, Pair


@record
class AttributionTarget(Record):
    class_: int = fact(minimum=0, key="class")
    label: str | None
    score: float | None
    probability: float | None
    objective: bool = fact(optional=True, doc=OBJECTIVE_DOC)


@record
class AttributionEvaluation(MapEvaluation):
    replacement_token: int = fact(
        doc="--text: the token id that deletion puts in and insertion starts from.",
        optional=True)


@record
class AttributionMap(MapFrames):
    method: Method
    smoothed: bool
    signed: bool
    target: AttributionTarget
    positive_mass: float | None
    negative_mass: float | None
    sum: float | None
    abs_mass: float | None
    max_abs: float | None
    rank: int = fact(minimum=0)
    layer: str
    baseline_score: float | None = fact(optional=True)
    completeness_gap: float | None = fact(optional=True)
    relative_gap: float | None = fact(optional=True)
    steps: int = fact(optional=True, minimum=1)
    gap_tolerance: float = fact(optional=True)
    files: dict[str, str]
    evaluation: AttributionEvaluation = fact(optional=True)
    tokens: list[float | None] = fact(optional=True)


@record
class TextTokens(Record):
    text: str
    tokens: list[str]


@record
class GenerationToken(Record):
    """A row of a generation's matrices: one generated (or given) token."""

    id: int = fact(minimum=0)
    token: str
    log_prob: float | None
    score: float | None = fact(doc="what the row explains: log p(token | prefix), minus log p(contrast | prefix) "
                                   "with --contrast")
    contrast_log_prob: float | None


@record
class GenerationColumn(Record):
    """A column: a token the rows are attributed to."""

    id: int = fact(minimum=0)
    token: str
    part: Literal["prompt", "start", "generated"] = fact(doc="the prompt (an encoder-decoder's encoder tokens), a "
                                                             "decoder's start token, or a token generated before")


@record
class GenerationContrast(Record):
    id: int = fact(minimum=0)
    token: str


@record
class Generation(Record):
    """attributions --generate/--continuation (issue 36): the continuation and its tokens x tokens matrices."""

    mode: Literal["greedy", "continuation"]
    stopped: bool = fact(doc="greedy generation ended at the end-of-sequence token")
    first_columns: int = fact(minimum=1, doc="the columns of the first row (the prompt, and a decoder's start "
                                             "token); row t has first_columns + t")
    text: str = fact(doc="the generated (or given) continuation, decoded")
    tokens: list[GenerationToken]
    columns: list[GenerationColumn]
    matrices: dict[str, list[list[float | None]]] = fact(doc="method -> rows x columns; null past each row's own "
                                                            "prefix")
    contrast: GenerationContrast = fact(optional=True)


@record
class AttributionsImage(Record):
    index: int = fact(minimum=0)
    image: str
    size: list[int] | None
    targets: list[int]
    maps: list[AttributionMap]
    files: dict[str, str]
    token_ids: list[int] = fact(optional=True)
    clip: Clip = fact(optional=True)
    pair: Pair = fact(optional=True)
    text: TextTokens = fact(
        doc="a text input (--text): the text and its real tokens, in order",
        optional=True)
    generation: Generation = fact(doc="--generate/--continuation: the continuation and its matrices (issue 36)",
                                  optional=True)


@record
class SanityRho(Record):
    spearman: list[float | None]
    spearman_abs: list[float | None]
    spearman_mean: float | None
    spearman_abs_mean: float | None


@record
class SanityStep(Record):
    randomized: int
    down_to: str
    methods: dict[str, SanityRho]


@record
class Sanity(Record):
    layers: list[str]
    seed: int
    method: str
    steps: list[SanityStep]


@record
class AttributionsReport(Record):
    """The ``attributions`` report's body (the envelope is output/jsonout's)."""

    TITLE = "inspect-model attributions report"
    model: str
    methods: list[Method]
    smoothed: list[Method]
    space: Literal["input", "embedding"]
    embedding_layer: str | None
    guided_sites: dict[str, int]
    images: list[AttributionsImage]
    image_count: int = fact(minimum=1)
    contact_sheets: list[str] = fact(optional=True)
    evaluation: Evaluation = fact(doc="--evaluate only: settings, cost and the methods ranked on average.", optional=True)
    sanity: Sanity | None
    warnings: list[Warning_]
    skipped: list[Skipped]
    throughput: dict[str, Any] = fact(optional=True)
