"""Where the model input lies on the original picture: boxes from model-input pixels to
picture pixels and back.

The preprocessing resizes and crops a picture into the model input and records the crop's
box (left, top, right, bottom) in the picture's pixels (``Preprocess.uncrop_box``). A box
found on the input (a detection) is drawn on the picture, and reported in the JSON as
``image_box``, through :func:`to_picture`; a box the user gives on the picture (``--boxes``)
reaches the model through :func:`from_picture`. One mapping for the pictures, the reports
and the options, so that they agree. Pure functions: no torch, no PIL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Box = tuple[float, float, float, float]


def _crop(crop: Sequence[float] | None, picture_size: tuple[int, int]) -> tuple[float, float, float, float]:
    if crop is not None:
        left, top, right, bottom = crop
        return float(left), float(top), float(right), float(bottom)
    return 0.0, 0.0, float(picture_size[0]), float(picture_size[1])  # the input is the whole picture


def to_picture(box: Sequence[float], crop: Sequence[float] | None, input_hw: tuple[int, int],
               picture_size: tuple[int, int]) -> Box:
    """A box in model-input pixels -> picture pixels. ``crop``: the input's box on the
    picture (None: the whole picture); ``input_hw``: (H, W) of the input; ``picture_size``:
    (width, height) of the picture."""
    h, w = input_hw
    left, top, right, bottom = _crop(crop, picture_size)
    sx, sy = (right - left) / w, (bottom - top) / h
    x0, y0, x1, y1 = box
    return left + x0 * sx, top + y0 * sy, left + x1 * sx, top + y1 * sy


def from_picture(box: Sequence[float], crop: Sequence[float] | None, input_hw: tuple[int, int],
                 picture_size: tuple[int, int]) -> Box:
    """A box in picture pixels (``--boxes``) -> model-input pixels; the inverse of
    :func:`to_picture`."""
    h, w = input_hw
    left, top, right, bottom = _crop(crop, picture_size)
    sx, sy = w / (right - left), h / (bottom - top)
    x0, y0, x1, y1 = box
    return (x0 - left) * sx, (y0 - top) * sy, (x1 - left) * sx, (y1 - top) * sy


@dataclass(frozen=True)
class PictureFrame:
    """One picture's mapping: its crop box, the input's (H, W) and the picture's (W, H)."""

    crop: tuple[float, float, float, float] | None
    input_hw: tuple[int, int]
    picture_size: tuple[int, int]

    def to_picture(self, box: Sequence[float] | None) -> list[float] | None:
        """``box`` (model-input pixels) in picture pixels, as a JSON list; None stays None."""
        if box is None:
            return None
        return [float(v) for v in to_picture(box, self.crop, self.input_hw, self.picture_size)]

    def from_picture(self, box: Sequence[float]) -> Box:
        return from_picture(box, self.crop, self.input_hw, self.picture_size)


def picture_frame(preprocess: Any, picture: Any, input_hw: tuple[int, int]) -> PictureFrame | None:
    """The frame of ``picture`` (a PIL image, or None for a tensor input: no picture, no
    frame) fed through ``preprocess`` (anything with ``uncrop_box(width, height)``, or None
    when the input is the picture as it is) into an input of ``input_hw``."""
    if picture is None:
        return None
    size = (int(picture.size[0]), int(picture.size[1]))
    crop = _crop(preprocess.uncrop_box(*size), size) if preprocess is not None else None
    return PictureFrame(crop, (int(input_hw[0]), int(input_hw[1])), size)
