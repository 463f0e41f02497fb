"""The ``cam`` report's records; its schema (schemas/cam.json) is generated from them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from inspect_model.reports.base import Record, Skipped, Warning_, fact, record
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
class MapConfidence(Record):
    original: NumberOrNull = fact(optional=True)
    masked: NumberOrNull = fact(optional=True)


@record
class MapEvaluation(Record):
    scores: FaithfulnessScores
    curves: FaithfulnessCurves
    confidence: MapConfidence = fact(
        doc="Target probability on the input (original) and on the input times the map (masked); "
            "empty without the confidence metric.")
    rank: float | None = fact(
        doc="Mean rank (1 = best) among the maps of the same image and target rank, over deletion, "
            "insertion, road, drop, increase, pointing, energy; ties share the mean place.")
    steps: dict[str, Annotated[int, {"minimum": 2}]] = fact(
        doc="--eval-steps auto: the steps each curve took.",
        optional=True)


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
class FaithfulnessScores(Record):
    DEF = "faithfulness_scores"
    CLOSED = True
    SCHEMA = {"description": "Faithfulness scores (cam --evaluate). deletion/insertion: AUC of the target probability over the fraction of pixels removed/inserted (Petsiuk et al. 2018; deletion lower is better, insertion higher). road_morf/road_lerf: mean target probability after removing the most/least relevant fraction (ROAD_FRACTIONS) with noisy linear imputation (Rong et al. 2022; MoRF lower, LeRF higher); road: (road_lerf - road_morf) / 2, higher is better. drop: average drop in confidence in percent, lower is better; increase: 100 when the confidence on input x map rose, else 0 (averaged: percent of maps), higher is better (Chattopadhyay et al. 2018). pointing: 1 when the map's maximum lies in a box, else 0 (averaged: accuracy); energy: share of the map's mass inside the boxes (both only with --boxes)."}

    deletion: NumberOrNull = fact(optional=True)
    insertion: NumberOrNull = fact(optional=True)
    road_morf: NumberOrNull = fact(optional=True)
    road_lerf: NumberOrNull = fact(optional=True)
    road: NumberOrNull = fact(optional=True)
    drop: NumberOrNull = fact(optional=True)
    increase: NumberOrNull = fact(optional=True)
    pointing: NumberOrNull = fact(optional=True)
    energy: NumberOrNull = fact(optional=True)


@record
class FaithfulnessCurves(Record):
    DEF = "faithfulness_curves"
    CLOSED = True
    SCHEMA = {"description": "Target probabilities: deletion/insertion at steps+1 evenly spaced fractions 0..1; road_morf/road_lerf at each of road_fractions."}

    deletion: list[NumberOrNull] = fact(optional=True)
    insertion: list[NumberOrNull] = fact(optional=True)
    road_morf: list[NumberOrNull] = fact(optional=True)
    road_lerf: list[NumberOrNull] = fact(optional=True)


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
class CamEvaluationInsertionBlur(Record):
    kernel: int = fact(optional=True)
    sigma: float = fact(optional=True)


@record
class CamEvaluationAverageEntry(Record):
    method: Method
    layer: str
    maps: int = fact(minimum=1)
    scores: FaithfulnessScores
    curves: FaithfulnessCurves
    rank: float | None = fact(doc="Mean rank over the averaged scores (1 = best).")
    mean_image_rank: float | None = fact(doc="The mean of this method's per-image ranks.")


@record
class CamEvaluation(Record):
    metrics: list[Literal["deletion", "insertion", "road", "confidence", "pointing", "energy"]]
    steps: Any = fact(
        doc="--eval-steps: steps of the deletion/insertion curves, or auto (each curve's own, in its "
            "map's evaluation.steps).",
        schema={"anyOf": [{"type": "integer", "minimum": 2}, {"const": "auto"}]})
    batch: int = fact(doc="--eval-batch: perturbed inputs per forward pass.", minimum=1)
    road_fractions: list[float] = fact(doc="Fractions of pixels removed by ROAD.")
    road_noise: float = fact(doc="Std of the noise added to imputed pixels.")
    insertion_blur: CamEvaluationInsertionBlur = fact(doc="The Gaussian blur insertion starts from.")
    boxes: str | None = fact(doc="The --boxes file.")
    passes: int = fact(doc="Forward passes run for the evaluation.", minimum=0)
    inputs: int = fact(doc="Perturbed inputs scored.", minimum=0)
    average: list[CamEvaluationAverageEntry] = fact(doc="One row per method and layer, best rank first.")
    plots: list[str] = fact(doc="evaluation_curves.png: the mean curves (with --output-dir).")
    tolerance: float = fact(
        doc="--eval-steps auto: the AUC change at which a curve stops refining.",
        optional=True)


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
