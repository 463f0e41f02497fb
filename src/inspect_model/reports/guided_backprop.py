"""The ``guided-backprop`` report's records; its schema (schemas/guided-backprop.json) is generated from them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from inspect_model.reports.base import Named, Record, Skipped, Warning_, fact, record
from inspect_model.reports.common import MapFrames, OBJECTIVE_DOC, Clip, Detection, NumberOrNull, Pair, Segment


Kind = Annotated[Literal["relu", "relu6", "leaky_relu", "silu", "gelu", "prelu"], Named("kind")]


Kinds = Annotated[list[Kind], Named("kinds")]


SiteCounts = Annotated[Any, Named("site_counts"), {"type": "object", "propertyNames": {"$ref": "#/$defs/kind"}, "additionalProperties": {"type": "integer", "minimum": 1}}]


@record
class GuidedTarget(Record):
    class_: int = fact(minimum=0, key="class")
    label: str | None
    score: NumberOrNull
    probability: NumberOrNull = fact(optional=True)
    objective: bool = fact(optional=True, doc=OBJECTIVE_DOC)


@record
class GuidedMap(MapFrames):
    DEF = "map"

    rank: int = fact(minimum=0)
    max_abs: NumberOrNull
    mean_abs: NumberOrNull
    nonzero_fraction: float = fact(minimum=0, maximum=1)
    files: Any = fact(
        doc="A clip's map: guided_strip (the gradient frames), magnitude_strip and "
            "magnitude_animation (|gradient| over the frames, PNG strip and GIF).",
        schema={"type": "object", "propertyNames": {"enum": ["guided", "magnitude", "raw", "guided_gradcam", "guided_gradcam_raw", "tokens", "guided_strip", "magnitude_strip", "magnitude_animation"]}, "additionalProperties": {"type": "string"}})
    target: GuidedTarget
    detection: Detection = fact(optional=True)
    segmentation: Segment = fact(optional=True)


@record
class GuidedImage(Record):
    DEF = "image"

    index: int = fact(minimum=0)
    maps: list[GuidedMap] = fact(
        doc="One per target; empty for a detector image with no detection at or above the threshold.")
    files: Any = fact(
        doc="flow: a flow model's prediction for the pair (torchvision's flow_to_image).",
        schema={"type": "object", "propertyNames": {"enum": ["overview", "flow"]}, "additionalProperties": {"type": "string"}})
    image: str
    targets: list[int]
    clip: Clip = fact(optional=True)
    pair: Pair = fact(optional=True)


@record
class SanityStep(Record):
    randomized: int = fact(minimum=1)
    down_to: str
    spearman: list[Rho]
    spearman_abs: list[Rho]
    spearman_mean: Rho
    spearman_abs_mean: Rho


@record
class Sanity(Record):
    DEF = "sanity"

    layers: list[str] = fact(minItems=1)
    seed: int
    method: str
    steps: list[SanityStep] = fact(minItems=1)


#: A Spearman correlation (a little slack for rounding), null where it is undefined.
Rho = Annotated[float | None, Named("rho"), {"minimum": -1.0000001, "maximum": 1.0000001}]


@record
class GuidedGradcam(Record):
    """--gradcam-layer: the layer of Guided Grad-CAM's CAM factor."""

    layer: str


@record
class GuidedBackpropReport(Record):
    """The ``guided-backprop`` report's body (the envelope is output/jsonout's)."""

    TITLE = "inspect-model guided-backprop report"
    model: str
    method: Any = fact(const="guided_backprop")
    activations: Kinds
    sites: SiteCounts
    unguided_sites: SiteCounts
    images: list[GuidedImage] = fact(minItems=1)
    guided_gradcam: GuidedGradcam | None
    sanity: Sanity | None
    notes: list[str] = fact(minItems=1)
    warnings: list[Warning_]
    skipped: list[Skipped]
    image_count: int = fact(optional=True, minimum=1)
