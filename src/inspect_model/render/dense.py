"""Pictures of detection and segmentation maps: boxes with class and score, mask outlines,
and the legend of a segmentation (predicted classes and their areas).

Coordinates: a detection's box and a mask are in model-input pixels; the overlay is drawn
on the original picture through the crop ``box`` (left, top, right, bottom) that the
preprocessing gives, so :func:`~inspect_model.loading.geometry.to_picture` maps input pixels
onto the picture (the same mapping gives the reports' ``image_box``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from inspect_model.loading.geometry import from_picture, to_picture

if TYPE_CHECKING:
    import numpy as np
    from PIL import Image

__all__ = ["annotate", "from_picture", "legend", "to_picture"]  # the mappings: re-exported from loading

HIGHLIGHT = (255, 40, 40)  # the detection the map explains
OTHERS = (255, 255, 255)  # the image's other detections
NAMED = (40, 230, 40)  # a box named in --boxes
PALETTE = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207)]


def _label(d: Any, xy: tuple[float, float], text: str, colour: tuple[int, int, int], size: int) -> None:
    from inspect_model.render import raster

    f = raster.font(size, True)
    x, y = xy
    _, _, tw, th = f.getbbox(text)
    y = max(y - th - 4, 0)
    d.rectangle((x, y, x + tw + 4, y + th + 4), fill=colour)
    d.text((x + 2, y + 1), text, font=f, fill=(0, 0, 0) if sum(colour) > 500 else (255, 255, 255))


def annotate(picture: Image.Image, *, crop: Sequence[float] | None, input_hw: tuple[int, int],
             box: Sequence[float] | None = None, caption: str = "", others: Sequence[tuple[Sequence[float], str]] = (),
             named: Sequence[float] | None = None, mask: np.ndarray | None = None) -> Image.Image:
    """``picture`` (an overlay) with the other detections thin and white, the explained one
    thick and red with its class and score, a named box green, and a mask's outline."""
    from PIL import ImageDraw

    img = picture.copy()
    d = ImageDraw.Draw(img)
    size = max(11, round(max(img.size) / 55))
    width = max(2, round(max(img.size) / 250))
    if mask is not None:
        _outline(img, mask, crop, input_hw)
    for ob, text in others:
        d.rectangle(to_picture(ob, crop, input_hw, img.size), outline=OTHERS, width=1)
    if named is not None:
        d.rectangle(to_picture(named, crop, input_hw, img.size), outline=NAMED, width=width)
    if box is not None:
        pb = to_picture(box, crop, input_hw, img.size)
        d.rectangle(pb, outline=HIGHLIGHT, width=width)
        if caption:
            _label(d, (pb[0], pb[1]), caption, HIGHLIGHT, size)
    elif caption:
        _label(d, (4, size + 10), caption, HIGHLIGHT, size)
    return img


def _outline(img: Image.Image, mask: np.ndarray, crop: Sequence[float] | None, input_hw: tuple[int, int]) -> None:
    """Draw the border pixels of ``mask`` (H_in, W_in bool) on ``img`` in place."""
    import numpy as np
    from PIL import Image

    left, top, right, bottom = crop if crop is not None else (0.0, 0.0, float(img.size[0]), float(img.size[1]))
    bw, bh = max(round(right - left), 1), max(round(bottom - top), 1)
    m = np.asarray(Image.fromarray(np.asarray(mask, dtype=np.uint8) * 255).resize((bw, bh), Image.NEAREST)) > 127
    edge = m & ~(np.roll(m, 1, 0) & np.roll(m, -1, 0) & np.roll(m, 1, 1) & np.roll(m, -1, 1))
    thick = max(1, round(max(img.size) / 400))
    for _ in range(thick - 1):
        edge = edge | np.roll(edge, 1, 0) | np.roll(edge, 1, 1)
    ys, xs = np.nonzero(edge)
    xs, ys = xs + round(left), ys + round(top)
    ok = (xs >= 0) & (ys >= 0) & (xs < img.size[0]) & (ys < img.size[1])
    px = img.load()
    for x, y in zip(xs[ok].tolist(), ys[ok].tolist()):
        px[x, y] = (255, 255, 255)


def legend(picture: Image.Image, classes: np.ndarray, entries: Sequence[dict[str, Any]], *,
           crop: Sequence[float] | None, title: str) -> Image.Image:
    """The predicted segmentation (``classes``: (h, w) class indices) coloured over the
    picture, beside a legend of the classes present and their areas (largest first)."""
    import numpy as np
    from PIL import Image, ImageDraw

    from inspect_model.render import raster

    img = picture.convert("RGB")
    left, top, right, bottom = crop if crop is not None else (0.0, 0.0, float(img.size[0]), float(img.size[1]))
    bw, bh = max(round(right - left), 1), max(round(bottom - top), 1)
    colours = {int(e["class"]): PALETTE[i % len(PALETTE)] for i, e in enumerate(entries)}
    lut = np.zeros((max(list(colours) + [int(classes.max())]) + 1, 3), dtype=np.uint8)
    for k, c in colours.items():
        lut[k] = c
    cls = np.asarray(Image.fromarray(classes.astype(np.int32)).resize((bw, bh), Image.NEAREST))
    colour = Image.fromarray(lut[cls], "RGB")
    region = img.crop((round(left), round(top), round(left) + bw, round(top) + bh))
    img.paste(Image.blend(region, colour, 0.55), (round(left), round(top)))
    fs = 13
    rows = [f"{e['class']}{' ' + e['label'] if e.get('label') else ''}: {100 * e['area_fraction']:.1f}% "
            f"({e['area']} px)" for e in entries]
    panel_w = max([raster.text_size(r, fs)[0] for r in rows] + [120]) + 40
    panel = Image.new("RGB", (panel_w, max(img.size[1], (fs + 8) * len(rows) + 10)), raster.BG)
    d = ImageDraw.Draw(panel)
    for i, (e, text) in enumerate(zip(entries, rows)):
        y = 6 + i * (fs + 8)
        d.rectangle((6, y, 6 + fs, y + fs), fill=colours[int(e["class"])])
        d.text((fs + 14, y), text, font=raster.font(fs), fill=raster.FG)
    body = Image.new("RGB", (img.size[0] + panel_w, max(img.size[1], panel.size[1])), raster.BG)
    body.paste(img, (0, 0))
    body.paste(panel, (img.size[0], 0))
    return raster.titled(body, [title, "predicted classes, largest area first (areas at the output resolution)"])
