"""Heat-map pictures: colour-mapped overlays on the original image, bare maps with a colour
bar, and contact sheets. Pure functions: arrays and PIL images in, PIL images out, drawn
with Pillow and a colormap lookup table (``render.raster``), no matplotlib
figure per picture (Pillow PNGs carry no timestamp, so the bytes are reproducible).

A map is computed on the model input (the resized, centre-cropped image); :func:`overlay`
draws it back on the *original* image through the crop box that
``Preprocess.uncrop_box`` gives, so the heat lands where the evidence was, and dims what the
model never saw.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inspect_model.errors import UsageError

if TYPE_CHECKING:
    import numpy as np
    from PIL import Image

FIG_DPI = 100
THUMB = 160  # contact-sheet cell side, pixels
HEAT_SIDE = 224  # a heat map is drawn at least this large
OVERLAY_SIDE = 1280  # an overlay's long side at most (a larger original is reduced first)


def check_colormap(name: str) -> str:
    """``name`` if matplotlib knows the colormap, else a usage error listing a few."""
    import matplotlib

    if name not in matplotlib.colormaps:
        from inspect_model.errors import suggest

        raise UsageError(f"--colormap '{name}' is not a matplotlib colormap"
                         + (suggest(name, list(matplotlib.colormaps)) or "; e.g. jet, turbo, inferno, viridis"))
    return name


def colorize(m: np.ndarray, cmap: str = "jet") -> np.ndarray:
    """(H, W) values in [0, 1] -> (H, W, 3) uint8 RGB (a lookup table, see ``render.raster``)."""
    from inspect_model.render.raster import colorize as lut_colorize

    return lut_colorize(m, cmap)


def overlay(image: Image.Image, m: np.ndarray, box: Sequence[float] | None = None, *,
            alpha: float = 0.5, cmap: str = "jet", dim_outside: float = 0.45,
            opacity: np.ndarray | None = None) -> Image.Image:
    """The map ``m`` (H, W) in [0, 1] blended over ``image`` (RGB or L), reduced to
    :data:`OVERLAY_SIDE` pixels on its long side when larger.

    ``box`` (left, top, right, bottom) in ``image`` pixels is where the model input came
    from; ``None`` means the whole image. Pixels outside the box are dimmed by
    ``dim_outside`` (the model did not see them); the box may reach past the image edges.
    ``opacity`` (H, W) in [0, 1], optional, scales ``alpha`` per pixel (attribution maps:
    their magnitude, so that where there is no evidence the picture shows through)."""
    import numpy as np
    from PIL import Image

    from inspect_model.render import raster

    img, box = viewable(image, box)
    img = img if img.mode == "RGB" else img.convert("RGB")
    width, height = img.size
    left, top, right, bottom = box if box is not None else (0.0, 0.0, float(width), float(height))
    bw, bh = max(round(right - left), 1), max(round(bottom - top), 1)
    ox, oy = round(left), round(top)
    # Outside the box: dimmed through a 256-entry table (Pillow, no float image).
    out = img.point(_dim_table(dim_outside))
    x0, y0, x1, y1 = max(ox, 0), max(oy, 0), min(ox + bw, width), min(oy + bh, height)
    if x1 <= x0 or y1 <= y0:
        return out
    # Inside: the map's colour levels resized onto the box (Pillow, 8 bits: 3x faster than a
    # float map; within 3 levels of colouring after a float resize), coloured by a palette,
    # and blended, only where the box meets the image (the box may reach past its edges).
    region = (x0 - ox, y0 - oy, x1 - ox, y1 - oy)
    levels = Image.fromarray(raster.levels(m), "L").resize((bw, bh), Image.BILINEAR).crop(region)
    levels.putpalette(raster.palette(cmap), "RGB")
    colour = np.asarray(levels.convert("RGB"), dtype=np.uint16)
    crop = np.asarray(img.crop((x0, y0, x1, y1)), dtype=np.uint16)
    if opacity is None:  # one alpha: in 1/256ths, rounded (alpha 0.5 is exact)
        a = min(max(round(float(alpha) * 256), 0), 256)
        crop *= 256 - a
        colour *= a
        crop += colour
        crop += 128
        blended = (crop >> 8).astype(np.uint8)
    else:  # alpha per pixel
        op = Image.fromarray(np.asarray(opacity, dtype=np.float32), mode="F").resize((bw, bh), Image.BILINEAR)
        w = (np.clip(np.asarray(op.crop(region)), 0.0, 1.0) * np.float32(alpha))[..., None]
        mixed = crop * (1.0 - w) + colour * w + 0.5
        blended = np.clip(mixed, 0, 255).astype(np.uint8)
    out.paste(Image.fromarray(blended, mode="RGB"), (x0, y0))
    return out


def viewable(image: Image.Image, box: Sequence[float] | None = None) -> tuple[Image.Image, Sequence[float] | None]:
    """``image`` reduced to :data:`OVERLAY_SIDE` on its long side when larger, and the crop
    ``box`` scaled with it (a 12-megapixel photo: 2 s and 8 MB per overlay at full size, and
    36 MB held per queued drawing job)."""
    from PIL import Image

    width, height = image.size
    scale = OVERLAY_SIDE / max(width, height, 1)
    if scale >= 1:
        return image, box
    size = (max(round(width * scale), 1), max(round(height * scale), 1))
    reduced = image.resize(size, Image.BILINEAR, reducing_gap=1.0)  # a box reduction first
    return reduced, None if box is None else tuple(v * scale for v in box)


@functools.lru_cache(maxsize=8)
def _dim_table(dim: float) -> list[int]:
    """Pillow's ``point`` table (R, G, B) that multiplies by ``1 - dim``, rounded."""
    keep = 1.0 - dim
    return [min(int(v * keep + 0.5), 255) for v in range(256)] * 3


def input_picture(x: Any, mean: Sequence[float] | None = None, std: Sequence[float] | None = None) -> Image.Image:
    """A viewable picture of a model input (C, H, W) tensor: de-normalised with ``mean``/
    ``std`` when known, else stretched to [0, 1] (synthetic inputs)."""
    import numpy as np
    from PIL import Image

    a = x.detach().float().cpu().numpy()
    c = a.shape[0]
    if mean is not None and std is not None and len(mean) == c and len(std) == c:
        a = a * np.asarray(std, dtype=np.float32)[:, None, None] + np.asarray(mean, dtype=np.float32)[:, None, None]
    else:
        lo, hi = float(a.min()), float(a.max())
        a = (a - lo) / (hi - lo) if hi > lo else np.zeros_like(a)
    a = np.clip(a, 0.0, 1.0)
    a = a[:3] if c >= 3 else np.repeat(a[:1], 3, axis=0)
    return Image.fromarray((a.transpose(1, 2, 0) * 255.0 + 0.5).astype(np.uint8), mode="RGB")


def heatmap_image(m: np.ndarray, title: str, *, cmap: str = "jet") -> Image.Image:
    """The bare map (input resolution, at least 224 px on its long side) with a colour bar
    saying what the colours mean; an all-zero (constant) map says so instead."""
    import numpy as np
    from PIL import Image

    from inspect_model.render import raster

    a = np.asarray(m, dtype=np.float32)
    h, w = a.shape[-2:]
    scale = max(1, math.ceil(HEAT_SIDE / max(h, w, 1)))
    body = raster.colorize_image(a, cmap) if a.size else Image.fromarray(raster.colorize(a, cmap), "RGB")
    if scale > 1:
        body = body.resize((w * scale, h * scale), Image.NEAREST)
    note = raster.constant_note(a)
    if note:
        right = raster.message_panel(110, body.size[1], "no colour scale: the map is constant")
    else:
        right = raster.colorbar(body.size[1], 0.0, 1.0, cmap, "relevance (normalised to [0, 1])")
    return raster.titled(body, title.split("\n"), right=right, note=note)


def thumbnail(image: Image.Image, side: int = THUMB) -> Image.Image:
    """A copy of ``image`` that fits in ``side`` x ``side`` (bounded memory for sheets):
    a box-filter reduction by a whole factor first (half the cost), then the exact fit."""
    from PIL import Image

    factor = max(image.size) // side
    t = image.reduce(factor) if factor >= 2 else image.copy()
    t.thumbnail((side, side), Image.BILINEAR)
    return t


@dataclass
class SheetCell:
    image: Image.Image  # a thumbnail
    title: str


def contact_sheet(rows: Sequence[tuple[str, Sequence[SheetCell | None]]], columns: Sequence[str],
                  title: str = "") -> Image.Image:
    """A dense grid: one row per (image, target), one column per (method, layer). Every
    column is named in a header row, every row in a label column on the left, and every
    cell captioned with its class and probability. Fixed size per cell, so the bytes depend
    on content only."""
    from PIL import Image, ImageDraw

    from inspect_model.render import raster

    fs, pad = 12, 4
    n_cols = max(len(columns), 1)
    cap_h = fs + 6
    cell_w = THUMB + pad
    # Each row is as tall as its tallest thumbnail: landscape images leave no blank band.
    row_h = [max([c.image.size[1] for c in cells if c is not None] or [THUMB // 2]) for _, cells in rows]
    label_w = 150
    # Headers are bold: measured bold, each wrapped (or ellipsised) within its own column.
    head_lines = [raster.wrap_text(c, fs, cell_w - 2 * pad, max_lines=2, bold=True) for c in columns] or [[]]
    head_h = (fs + 4) * max(len(h) for h in head_lines) + pad * 2
    title_h = (fs + 10) if title else 0
    width = label_w + n_cols * cell_w + pad
    height = title_h + head_h + sum(h + cap_h + pad for h in row_h) + pad
    img = Image.new("RGB", (width, height), raster.BG)
    d = ImageDraw.Draw(img)
    if title:
        d.text((width // 2, pad), raster.fit_text(title, fs + 1, width - 2 * pad, bold=True),
               font=raster.font(fs + 1, True), fill=raster.FG, anchor="ma")
    y0 = title_h
    for ci, lines in enumerate(head_lines):
        cx = label_w + ci * cell_w + cell_w // 2
        for li, t in enumerate(lines):
            d.text((cx, y0 + pad + li * (fs + 4)), t, font=raster.font(fs, True), fill=raster.FG, anchor="ma")
    d.line((pad, y0 + head_h - 2, width - pad, y0 + head_h - 2), fill=(200, 200, 200))
    top = y0 + head_h
    for (row_title, cells), rh in zip(rows, row_h):
        lines = raster.wrap_text(row_title, fs, label_w - 2 * pad, max_lines=3)
        ly = top + rh // 2 - len(lines) * (fs + 4) // 2
        for li, t in enumerate(lines):
            d.text((label_w - pad, ly + li * (fs + 4)), t, font=raster.font(fs), fill=raster.FG, anchor="ra")
        for ci in range(n_cols):
            cell = cells[ci] if ci < len(cells) else None
            x = label_w + ci * cell_w
            if cell is None:
                d.rectangle((x + pad // 2, top, x + cell_w - pad // 2, top + rh), fill=(245, 245, 245))
                continue
            tw, th = cell.image.size
            img.paste(cell.image, (x + (cell_w - tw) // 2, top + (rh - th) // 2))
            d.text((x + cell_w // 2, top + rh + 2), raster.fit_text(cell.title, fs - 1, cell_w - pad),
                   font=raster.font(fs - 1), fill=raster.FG, anchor="ma")
        top += rh + cap_h + pad
    return img


#: methods/cam/maths.py's NUMERIC_ZERO (render does not import methods; a test holds them equal).
NUMERIC_ZERO = "the map is numerically zero"
ZERO_LINE = "numerically zero (float noise, not evidence): drawn blank"


def zero_line(warnings: Sequence[str] | None) -> str:
    """The picture's line for a map that is float noise (issue 39), else ''."""
    return ZERO_LINE if any(str(w).startswith(NUMERIC_ZERO) for w in warnings or ()) else ""
