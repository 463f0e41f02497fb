"""Report records shared by several commands (their ``$defs``: clips, pairs, boxes, ...)."""

from __future__ import annotations

from typing import Annotated, Literal

from inspect_model.reports.base import Named, Record, fact, record


Method = Annotated[str, Named("method")]  # the enum: the command's method registry


NumberOrNull = Annotated[float | None, Named("number_or_null")]


OBJECTIVE_DOC = ("true when the target is a named objective of a text or embedding model (its label, e.g. "
                 "\"log p(' mat' | text) at position 5\", is the score; class is its index 0), absent for a class")


@record
class Clip(Record):
    DEF = "clip"
    SCHEMA = {"description": "The clip of a video this entry is (video models): the video, the clip's number, its frame indices and the decoder's frame times (seconds; null for a folder of frames)."}

    video: str
    clip: int = fact(minimum=0)
    frames: list[Annotated[int, {"minimum": 0}]]
    times: list[float | None]
    video_frames: int = fact(optional=True, minimum=1)
    fps: float | None = fact(optional=True)


@record
class ImageText(Record):
    """A text input's entry (``--text``): the text and its tokens as the tokenizer names them
    (activations, attention)."""

    text: str
    tokens: list[str]
    query: int = fact(doc="attention: the query token", optional=True)
    causal: bool = fact(optional=True)


@record
class MapFrames(Record):
    """A map entry's video frames (video models): the base of the cam, attributions and
    guided-backprop map records, whose maps of a clip are (T, H, W)."""

    clip: int = fact(doc="the clip's number within its video", optional=True, minimum=0)
    frames: list[Annotated[int, {"minimum": 0}]] = fact(
        doc="the video frames the (T, H, W) map covers",
        optional=True)
    times: list[float | None] = fact(
        doc="the decoder's times of those frames (seconds; null for a folder of frames)",
        optional=True)


@record
class Pair(Record):
    DEF = "pair"
    SCHEMA = {"description": "The two images of an optical-flow sample (first, second); frame indices and times when they come from a video."}

    images: list[str] = fact(minItems=2, maxItems=2)
    frames: list[int] = fact(optional=True, minItems=2, maxItems=2)
    times: list[float | None] = fact(optional=True)


@record
class Detection(Record):
    DEF = "detection"
    SCHEMA = {"description": "Detectors (issue 24): the detection a map explains. score: what is differentiated, the detection's confidence plus its IoU with matched_box when --boxes names one (pytorch-grad-cam's FasterRCNNBoxScoreTarget)."}

    class_: int = fact(minimum=0, key="class")
    label: str | None
    score: float | None
    box: InputBox
    image_box: ImageBox
    confidence: float | None
    matched_box: InputBox = fact(doc="the --boxes box the detection was matched to, in model-input pixels")
    matched_image_box: ImageBox = fact(
        doc="matched_box in the original picture's pixels: the --boxes box as given")
    iou: float | None


@record
class Segment(Record):
    DEF = "segment"
    SCHEMA = {"description": "Segmenters (issue 24): the class and mask a map explains. score: the sum of the class's logits over the mask (pytorch-grad-cam's SemanticSegmentationTarget); area: pixels of the mask at the output's resolution; mask_source: predicted (the pixels predicted as the class), predicted in box, box or all (CLASS@all), all (class absent) when no pixel was predicted as the class."}

    class_: int = fact(minimum=0, key="class")
    label: str | None
    score: float | None
    area: int | None = fact(minimum=0)
    area_fraction: float | None
    mask_source: Literal["predicted", "predicted in box", "box", "all", "all (class absent)"]
    region: InputBox = fact(
        doc="the --boxes box the mask is limited to (one box), in model-input pixels",
        optional=True)
    image_region: ImageBox = fact(doc="region in the original picture's pixels", optional=True)


InputBox = Annotated[list[float] | None, Named("input_box"), {"minItems": 4, "maxItems": 4, "description": "x0, y0, x1, y1 in model-input pixels (after --resize/--crop or the model's own preprocessing)"}]


ImageBox = Annotated[list[float] | None, Named("image_box"), {"minItems": 4, "maxItems": 4, "description": "x0, y0, x1, y1 in the original picture's pixels, as --boxes takes them and the pictures draw them (the input box mapped back through the resize and crop); null when no picture is known (a tensor input)"}]


@record
class PositionsLayer(Record):
    """One layer's statistics per token position (``--text``)."""

    name: str
    kind: Literal["output", "gradient"]
    tokens: list[Annotated[int, {"minimum": 0}]] = fact(doc="real tokens at each position")
    mean: list[float | None]
    std: list[float | None]
    norm: list[float | None] = fact(doc="mean L2 norm of a token's vector at each position")
    width: int


@record
class Positions(Record):
    over: str
    layers: list[PositionsLayer]


POSITIONS_DOC = ("--text: statistics per token position of the chosen layers' (B, L, D) outputs (grads: and of "
                 "their gradients), over the real (unpadded) tokens of every text")
