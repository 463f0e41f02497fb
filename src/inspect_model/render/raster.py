"""Fast pictures: colormap lookup tables, fonts, text and colour bars drawn with Pillow.

A matplotlib figure costs tens of milliseconds to lay out and rasterise; a heat map needs
none of it. Values in [0, 1] become colours through a 256-entry lookup table taken once
from matplotlib's colormap (the same colours matplotlib would draw), text is drawn with
the DejaVu Sans that matplotlib ships (so every picture uses one typeface), and colour bars
are a gradient strip with ticks from matplotlib's ``MaxNLocator`` (no figure). Everything
here is deterministic: the same arrays give the same pixels, hence the same PNG bytes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from PIL import Image, ImageFont

BG = (255, 255, 255)
FG = (20, 20, 20)
MUTED = (110, 110, 110)


@functools.lru_cache(maxsize=32)
def colormap_lut(name: str) -> np.ndarray:
    """(256, 3) uint8 RGB: matplotlib's colormap ``name`` sampled at its 256 levels."""
    import matplotlib
    import numpy as np

    rgba = matplotlib.colormaps[name].resampled(256)(np.arange(256))
    lut = (rgba[:, :3] * 255.0 + 0.5).astype(np.uint8)
    lut.setflags(write=False)
    return lut


def levels(values: np.ndarray) -> np.ndarray:
    """Values in [0, 1] (NaN: 0) -> uint8 indices 0..255, binned as matplotlib bins them."""
    import numpy as np

    x = np.multiply(np.asarray(values, dtype=np.float32), np.float32(256.0), dtype=np.float32)
    np.fmax(x, 0.0, out=x)  # fmax/fmin drop NaN: NaN -> 0, and -inf -> 0, +inf -> 255
    np.fmin(x, 255.0, out=x)
    return x.astype(np.uint8)


def colorize(values: np.ndarray, cmap: str) -> np.ndarray:
    """(...) values in [0, 1] -> (..., 3) uint8 RGB through the lookup table."""
    import numpy as np

    return np.take(colormap_lut(cmap), levels(values), axis=0)  # 5x faster than lut[idx]


def colorize_image(values: np.ndarray, cmap: str) -> Image.Image:
    """(H, W) values in [0, 1] -> an RGB image, the pixels of :func:`colorize`: Pillow's
    palette lookup (a heat map or an overlay's map: 0.2 ms less than ``np.take`` each)."""
    from PIL import Image

    img = Image.fromarray(levels(values), "L")
    img.putpalette(palette(cmap), "RGB")
    return img.convert("RGB")


@functools.lru_cache(maxsize=32)
def palette(cmap: str) -> bytes:
    """The lookup table as a Pillow palette (768 bytes)."""
    return colormap_lut(cmap).tobytes()


@functools.lru_cache(maxsize=16)
def font(size: int, bold: bool = False) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """DejaVu Sans at ``size`` pixels (matplotlib's own font file), else Pillow's default."""
    from PIL import ImageFont

    try:
        import matplotlib

        name = "DejaVuSans-Bold.ttf" if bold else "DejaVuSans.ttf"
        return ImageFont.truetype(f"{matplotlib.get_data_path()}/fonts/ttf/{name}", size)
    except (ImportError, OSError):
        return ImageFont.load_default(size)


def shown(text: Any) -> str:
    """``text`` as a picture shows it: one line, control characters and bytes that are not
    UTF-8 escaped (Pillow's text layout fails on a newline or a lone surrogate, issue 28)."""
    from inspect_model.render.table import one_line

    return one_line(text)


@functools.lru_cache(maxsize=4096)
def text_size(text: str, size: int, bold: bool = False) -> tuple[int, int]:
    """(width, height) of one line of ``text`` (cached: titles and labels repeat)."""
    _, _, right, bottom = font(size, bold).getbbox(shown(text) or " ")
    return math.ceil(right), math.ceil(max(bottom, size))


def fit_text(text: str, size: int, width: int, bold: bool = False) -> str:
    """``text`` shortened with an ellipsis in the middle so that it fits ``width`` pixels
    (measured in the font it is drawn in: bold is wider)."""
    text = shown(text)
    if text_size(text, size, bold)[0] <= width or len(text) <= 3:
        return text
    lo, hi = 1, len(text)
    while lo < hi:  # the longest shortening that fits
        mid = (lo + hi + 1) // 2
        cand = text[: mid // 2] + "…" + text[len(text) - (mid - mid // 2):]
        if text_size(cand, size, bold)[0] <= width:
            lo = mid
        else:
            hi = mid - 1
    return text[: lo // 2] + "…" + text[len(text) - (lo - lo // 2):]


def wrap_text(text: str, size: int, width: int, max_lines: int = 2, bold: bool = False) -> list[str]:
    """``text`` broken into at most ``max_lines`` lines of ``width`` pixels in the (``bold``)
    font it is drawn in (the last one shortened with an ellipsis when the text is longer)."""
    lines: list[str] = []
    rest = shown(text)
    while rest and len(lines) < max_lines - 1:
        if text_size(rest, size, bold)[0] <= width:
            break
        cut = len(rest)
        while cut > 1 and text_size(rest[:cut], size, bold)[0] > width:
            cut -= 1
        space = rest.rfind(" ", 0, cut)
        if 0 < space and len(lines) == max_lines - 2 and text_size(rest[space:].strip(), size, bold)[0] <= width:
            lines.append(rest[:space].rstrip())  # a word break that leaves the rest whole: "gradcam @" /
            rest = rest[space:].lstrip()  # "backbone.fpn", not "gradcam @ backbone." / "fpn"
            break
        for sep in (" ", "_", "-", ".", "/"):
            at = rest.rfind(sep, 0, cut)
            if at > cut // 2:
                space = at + (0 if sep == " " else 1)
                break
        cut = space if space > cut // 2 else cut
        lines.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    if rest:
        lines.append(fit_text(rest, size, width, bold))
    return lines


def vertical_text(text: str, size: int, fill: tuple[int, int, int] = FG) -> Image.Image:
    """``text`` rotated 90 degrees (reading upwards), on white, as an RGB image."""
    from PIL import Image, ImageDraw

    text = shown(text)
    w, h = text_size(text, size)
    img = Image.new("RGB", (w + 2, h + 4), BG)
    ImageDraw.Draw(img).text((1, 1), text, font=font(size), fill=fill)
    return img.transpose(Image.Transpose.ROTATE_90)


def ticks(vmin: float, vmax: float, n: int = 5) -> list[float]:
    """Round tick values inside [vmin, vmax] (matplotlib's MaxNLocator, no figure)."""
    from matplotlib.ticker import MaxNLocator

    if not (math.isfinite(vmin) and math.isfinite(vmax)) or vmax <= vmin:
        return [vmin]
    span = vmax - vmin
    vals = MaxNLocator(nbins=n).tick_values(vmin, vmax)
    return [float(v) for v in vals if vmin - 1e-9 * span <= v <= vmax + 1e-9 * span]


def tick_label(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    return f"{v:.3g}" if 1e-3 <= a < 1e5 else f"{v:.1e}"


@functools.lru_cache(maxsize=64)
def colorbar(height: int, vmin: float, vmax: float, cmap: str, label: str, *, size: int = 11,
             bar_width: int = 14) -> Image.Image:
    """A vertical colour bar ``height`` px tall: the gradient, ticks with values on its
    right, and ``label`` written upwards beside them. Cached (every heat map of a run has
    the same one): the image is shared, so callers paste it and never draw on it."""
    import numpy as np
    from PIL import Image, ImageDraw

    labels = [(v, tick_label(v)) for v in ticks(vmin, vmax)]
    tw = max((text_size(t, size)[0] for _, t in labels), default=0)
    lab = vertical_text(label, size) if label else None
    lab_w = lab.size[0] if lab is not None else 0
    pad = size // 2 + 1
    width = bar_width + 4 + tw + 6 + lab_w
    img = Image.new("RGB", (width, height), BG)
    top, bottom = pad, height - pad
    span = max(bottom - top, 1)
    grad = np.linspace(1.0, 0.0, span, dtype=np.float32)  # top is vmax
    strip = np.repeat(colorize(grad, cmap)[:, None, :], bar_width, axis=1)
    img.paste(Image.fromarray(strip, "RGB"), (0, top))
    d = ImageDraw.Draw(img)
    d.rectangle((0, top, bar_width - 1, bottom - 1), outline=FG)
    rng = vmax - vmin if vmax > vmin else 1.0
    for v, t in labels:
        y = bottom - 1 - (v - vmin) / rng * (span - 1)
        d.line((bar_width - 1, y, bar_width + 2, y), fill=FG)
        d.text((bar_width + 4, y), t, font=font(size), fill=FG, anchor="lm")
    if lab is not None:
        img.paste(lab, (width - lab_w, max(0, (height - lab.size[1]) // 2)))
    return img


def titled(body: Image.Image, lines: Sequence[str], *, size: int = 13, right: Image.Image | None = None,
           note: str = "", margin: int = 8) -> Image.Image:
    """``body`` with title ``lines`` above it (the first one bold), an optional panel
    (a colour bar) on its right, and an optional ``note`` line under everything."""
    from PIL import Image, ImageDraw

    line_h = size + 5
    rw = right.size[0] + margin if right is not None else 0
    inner_w = body.size[0] + rw
    want = max([text_size(t, size, i == 0)[0] for i, t in enumerate(lines)] + [0]) + 2 * margin
    width = max(inner_w + 2 * margin, min(want, 1000), 200)
    title_w = width - 2 * margin
    shown = [fit_text(t, size, title_w, i == 0) for i, t in enumerate(lines)]
    head = margin + line_h * len(shown) + (margin // 2 if shown else 0)
    foot = (line_h + margin // 2) if note else 0
    height = head + max(body.size[1], right.size[1] if right is not None else 0) + foot + margin
    img = Image.new("RGB", (width, height), BG)
    d = ImageDraw.Draw(img)
    for i, t in enumerate(shown):
        d.text((width // 2, margin + i * line_h), t, font=font(size, i == 0), fill=FG, anchor="ma")
    x0 = (width - inner_w) // 2
    img.paste(body, (x0, head))
    if right is not None:
        img.paste(right, (x0 + body.size[0] + margin, head))
    if note:
        y = head + max(body.size[1], right.size[1] if right is not None else 0) + margin // 2
        d.text((width // 2, y), fit_text(note, size - 1, title_w), font=font(size - 1), fill=MUTED, anchor="ma")
    return img


def constant_note(values: Any) -> str:
    """``"all values are 0"`` when every finite value is the same (nothing to see), else ''."""
    import numpy as np

    a = np.asarray(values)
    fin = a[np.isfinite(a)]
    if fin.size == 0:
        return "no finite values (all NaN/Inf)" if a.size else "empty"
    lo, hi = float(fin.min()), float(fin.max())
    if lo == hi:
        return f"all values are {tick_label(lo)}: nothing to show"
    return ""


def message_panel(width: int, height: int, text: str, size: int = 12) -> Image.Image:
    """A grey panel saying ``text`` (used where a colour bar would mean nothing)."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (width, height), (240, 240, 240))
    d = ImageDraw.Draw(img)
    lines = wrap_text(text, size, width - 8, max_lines=4)
    y0 = height // 2 - len(lines) * (size + 3) // 2
    for i, t in enumerate(lines):
        d.text((width // 2, y0 + i * (size + 3)), t, font=font(size), fill=MUTED, anchor="ma")
    return img
