"""The ``activations`` report's records; its schema (schemas/activations.json) is generated from them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from inspect_model.reports.base import Record, Skipped, Warning_, fact, record
from inspect_model.reports.common import ImageText, POSITIONS_DOC, Clip, NumberOrNull, Pair, Positions


@record
class Stats(Record):
    DEF = "stats"
    CLOSED = True

    numel: int = fact(minimum=0)
    mean: NumberOrNull
    std: NumberOrNull
    min: NumberOrNull
    max: NumberOrNull
    zero_fraction: float = fact(minimum=0, maximum=1)
    negative_fraction: float = fact(minimum=0, maximum=1)
    nan_count: int = fact(minimum=0)
    inf_count: int = fact(minimum=0)


@record
class LayerLayout(Record):
    CLOSED = True

    kind: Literal["ncthw", "nthwc", "tokens"]
    grid: list[Annotated[int, {"minimum": 1}]] = fact(minItems=3, maxItems=3)
    prefix_tokens: int = fact(minimum=0)
    channels: int = fact(minimum=0)
    note: str


@record
class Layer(Record):
    DEF = "layer"
    CLOSED = True

    key: str = fact(doc="name, name#i for the i-th call of a reused module, /k for output k")
    name: str
    type: str
    call_index: int = fact(minimum=0)
    calls: int = fact(minimum=1)
    depth: int = fact(minimum=0)
    order: int = fact(minimum=0)
    output_key: str
    shape: list[Annotated[int, {"minimum": 0}]]
    dtype: str
    per_image: bool
    stats: Stats
    channel_dim: int | None = fact(minimum=0)
    channels: int = fact(minimum=0)
    dead_channels: int = fact(minimum=0)
    dead_channel_fraction: float = fact(minimum=0, maximum=1)
    channel_means: list[NumberOrNull]
    drawn: bool
    layout: LayerLayout = fact(
        doc="A drawn clip layer's output laid out on its (frames, h, w) grid (video models): ncthw "
            "(3-D convolutions), nthwc (Swin3D stages, channels last) or tokens (MViT: prefix_tokens "
            "class token(s) dropped, the rest row-major over grid); its grids are drawn one column "
            "per frame.",
        optional=True)


@record
class Grid(Record):
    DEF = "grid"

    image: str
    layer: str
    file: str | None
    kind: Literal["grid", "heatmap", "bars", "strip", "frames"]
    rows: int = fact(minimum=0)
    cols: int = fact(minimum=0)
    channels: list[Annotated[int, {"minimum": 0}]]
    total_channels: int = fact(minimum=0)
    note: str = fact(optional=True)


ActivationsImageText = ImageText


@record
class ActivationsImage(Record):
    index: int = fact(minimum=0)
    image: str
    files: dict[str, str]
    clip: Clip = fact(optional=True)
    pair: Pair = fact(optional=True)
    text: ActivationsImageText = fact(
        doc="--text: the text and its tokens as the tokenizer names them",
        optional=True)


@record
class ActivationsQuantizedLayers(Record):
    count: int = fact(minimum=1)
    statistics: Any = fact(const="dequantized values")


@record
class LineLayer(Stats):
    """A row's statistics over one image (``--jsonl``)."""

    DEF = None
    key: str
    dead_channel_fraction: float = fact(minimum=0, maximum=1)


@record
class ImageLine(Record):
    """One ``--jsonl`` line of ``activations``: an image's statistics per row (not in the report)."""

    image: str
    index: int = fact(minimum=0)
    layers: list[LineLayer]
    files: Any


@record
class ActivationsReport(Record):
    """The ``activations`` report's body (the envelope is output/jsonout's)."""

    TITLE = "inspect-model activations report"
    SCHEMA = {"description": "The --json document of `inspect-model activations` (and activations.json in --output-dir). NaN/Inf numbers are written as null and their JSON paths listed under `nonfinite`."}

    model: str
    images: list[ActivationsImage]
    batches: int = fact(minimum=0)
    aggregation: str
    selected_layers: list[str]
    drawn_layers: list[str]
    layers: list[Layer]
    grids: list[Grid]
    warnings: list[Warning_]
    image_count: int = fact(minimum=0)
    skipped: list[Skipped]
    quantized_layers: ActivationsQuantizedLayers = fact(
        doc="rows whose output is a quantized tensor: their statistics are of the dequantized values",
        optional=True)
    positions: Positions = fact(doc=POSITIONS_DOC, optional=True)
