"""The ``cam`` report's records; its schema (schemas/cam.json) is generated from them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from inspect_model.reports.base import Record, Skipped, Warning_, fact, record
from inspect_model.reports.faithfulness import Evaluation as CamEvaluation, MapEvaluation
from inspect_model.reports.common import MapFrames, OBJECTIVE_DOC, Clip, Detection, ImageBox, InputBox, Method, NumberOrNull, Pair, Segment


@record
class ClassScore(Record):
    DEF = "class"
    SCHEMA = {"dependentRequired": {"box": ["image_box"]}}

    label: str | None
    score: NumberOrNull
    probability: float | None = fact(minimum=0, maximum=1)
    class_: int = fact(minimum=0, key="class")
    box: InputBox = fact(optional=True)
    image_box: ImageBox = fact(optional=True)
    objective: bool = fact(optional=True, doc=OBJECTIVE_DOC)


@record
class CamMapFiles(Record):
    CLOSED = True

    overlay: str = fact(optional=True)
    heatmap: str = fact(optional=True)
    raw_input: str = fact(optional=True)
    raw_layer: str = fact(optional=True)
    strip: str = fact(doc="a clip's map over its frames, one overlay per frame", optional=True)
    animation: str = fact(doc="a clip's animated overlay (GIF)", optional=True)




@record
class DenseMapStats(Record):
    peak: list[int] = fact(optional=True)
    mean: float = fact(optional=True)
    energy_in_box: float | None = fact(optional=True)
    peak_in_box: bool = fact(optional=True)


@record
class CamMap(MapFrames):
    method: Method
    layer: str
    rank: int = fact(minimum=0)
    target: ClassScore
    class_independent: bool
    raw_min: NumberOrNull
    raw_max: NumberOrNull
    warnings: list[str]
    files: CamMapFiles
    evaluation: MapEvaluation = fact(doc="cam --evaluate only: this map's faithfulness.", optional=True)
    detection: Detection = fact(optional=True)
    segmentation: Segment = fact(optional=True)
    stats: DenseMapStats = fact(
        doc="Detection/segmentation maps: the map's peak (x, y in input pixels), mean, and for a "
            "detection the share of the map inside its box and whether the peak lies in it.",
        optional=True)


@record
class CamImageFiles(Record):
    evaluation_curves: str = fact(
        doc="cam --evaluate with --output-dir: this image's deletion/insertion curves plot.",
        optional=True)


@record
class LegendEntry(Record):
    class_: int = fact(key="class")
    label: str | None
    area: int
    area_fraction: float


@record
class CamImage(Record):
    DEF = "image"

    command: Any = fact(optional=True, const="cam")
    index: int = fact(minimum=0)
    image: str
    size: list[int] | None
    predictions: list[ClassScore]
    targets: list[int]
    maps: list[CamMap]
    files: CamImageFiles
    clip: Clip = fact(optional=True)
    pair: Pair = fact(optional=True)
    task: Literal["detection", "segmentation"] = fact(
        doc="Present for detectors and segmenters (issue 24).",
        optional=True)
    detections: list[Detection] = fact(optional=True)
    segments: list[Segment] = fact(optional=True)
    legend: list[LegendEntry] = fact(
        doc="Segmenters: the predicted classes, largest area first.",
        optional=True)




@record
class CamLayer(Record):
    name: str
    output_shape: list[int]
    kind: Literal["nchw", "nhwc", "tokens", "ncthw", "nthwc", "pyramid"]
    grid: list[Annotated[int, {"minimum": 1}]] = fact(
        doc="(h, w), or (t, h, w) for a video model's layer",
        minItems=2, maxItems=3)
    prefix_tokens: int = fact(minimum=0)
    channels: int = fact(minimum=1)
    levels: dict[str, list[int]] = fact(
        doc="A feature pyramid's levels (name -> per-sample shape), combined on one grid (kind "
            "pyramid).",
        optional=True)


@record
class CamPasses(Record):
    forward: int = fact(minimum=0)
    backward: int = fact(minimum=0)
    scorecam_forward: int = fact(minimum=0)





@record
class CamReport(Record):
    """The ``cam`` report's body (the envelope is output/jsonout's)."""

    TITLE = "inspect-model cam report"
    model: str
    methods: list[Method] = fact(minItems=1)
    layers: list[CamLayer] = fact(minItems=1)
    target: str
    fuse: bool
    image_count: int = fact(minimum=0)
    passes: CamPasses
    contact_sheets: list[str]
    warnings: list[Warning_]
    skipped: list[Skipped]
    images: list[CamImage]
    evaluation: CamEvaluation = fact(
        doc="cam --evaluate only: settings, cost and the methods ranked on average.",
        optional=True)
    task: Literal["detection", "segmentation"] = fact(
        doc="Present for detectors and segmenters (issue 24).",
        optional=True)
    score_threshold: float | None = fact(doc="Detectors: the threshold in force.", optional=True)
