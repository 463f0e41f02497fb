"""Feature-map pictures: one layer's output for one image, drawn with numpy and Pillow.

A (C, H, W) output becomes a near-square grid of C tiles (64 channels: 8x8), each titled
with its channel index, drawn with one colour map and one colour bar. ``scale="layer"``
shares one value range across the tiles (the colour bar is in activation units);
``scale="each"`` stretches every tile to its own min..max (the colour bar reads 0..1).
Token outputs (T, D) of ViT-like models become a grid of D maps when the tokens (after
dropping a class token) form a square; other 2-D outputs (Conv1d (C, L), tokens that do
not form a square) are a heat map; 1-D outputs (Linear) are a heat-map strip, wrapped in
rows of 64. A 5-D (C, T, H, W) output is averaged over T. A map whose values are all equal
(a dead layer) says so instead of showing a meaningless colour bar.

Renderers are pure: numpy arrays in, a PIL image out. The tiles are laid into one numpy
canvas and coloured through one colormap lookup table (``render.raster``), so a 64-channel
grid costs about what torchvision's ``make_grid`` + ``save_image`` does; the PNG bytes depend
on the values only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inspect_model.errors import UsageError

if TYPE_CHECKING:
    import numpy as np
    from PIL import Image

DPI = 100
SCALES = ("each", "layer")
STRIP_WIDTH = 64


@dataclass(frozen=True)
class ChannelSpec:
    """Which channels to draw: the first ``max_channels``, the ``top`` N most active
    (highest mean for that image, most active first), or an explicit list."""

    top: int | None = None
    indices: tuple[int, ...] | None = None
    max_channels: int = 64  # 0: all

    def describe(self) -> str:
        if self.top is not None:
            return f"top:{self.top}"
        if self.indices is not None:
            return ",".join(str(i) for i in self.indices)
        return f"first {self.max_channels}" if self.max_channels else "all"


def parse_channels(spec: str | None, max_channels: int = 64) -> ChannelSpec:
    """``top:16``, ``0,5,8-11`` or None (the first ``max_channels``; 0 for all)."""
    if max_channels < 0:
        raise UsageError(f"--max-channels must be 0 (all) or more, got {max_channels}")
    if spec is None or not spec.strip():
        return ChannelSpec(max_channels=max_channels)
    s = spec.strip().lower()
    m = re.fullmatch(r"top:(\d+)", s)
    if m:
        n = int(m.group(1))
        if n < 1:
            raise UsageError(f"--channels '{spec}': top:N needs N >= 1, e.g. top:16")
        return ChannelSpec(top=n, max_channels=max_channels)
    out: list[int] = []
    for part in s.split(","):
        part = part.strip()
        r = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not r:
            raise UsageError(f"--channels '{spec}' is not top:N or a list like 0,5,8-11")
        a = int(r.group(1))
        b = int(r.group(2)) if r.group(2) is not None else a
        if b < a:
            raise UsageError(f"--channels '{spec}': range {part} runs backwards; write {b}-{a}")
        out.extend(i for i in range(a, b + 1) if i not in out)
    return ChannelSpec(indices=tuple(out), max_channels=max_channels)


def pick_channels(means: Sequence[float], spec: ChannelSpec, *, layer: str = "") -> list[int]:
    """Indices to draw, given each channel's mean for this image."""
    n = len(means)
    if spec.indices is not None:
        bad = [i for i in spec.indices if i >= n]
        if bad:
            raise UsageError(
                f"--channels {bad[0]}: layer '{layer}' has {n} channels (0..{n - 1}); "
                "pick indices in range or use top:N"
            )
        return list(spec.indices)
    if spec.top is not None:
        # NaN means sort last; ties by index, so the order is reproducible.
        key = [(-(-math.inf if math.isnan(m) else m), i) for i, m in enumerate(means)]
        return [i for _, i in sorted(key)[: spec.top]]
    return list(range(n if not spec.max_channels else min(n, spec.max_channels)))


@dataclass(frozen=True)
class GridLayout:
    """How a figure was laid out (for reports and tests)."""

    kind: str  # "grid", "heatmap", "bars", "strip"
    rows: int
    cols: int
    channels: tuple[int, ...]  # channel indices drawn, in drawing order
    total_channels: int
    note: str = ""


def grid_shape(n: int) -> tuple[int, int]:
    """Near-square (rows, cols) for n tiles: 64 -> (8, 8), 10 -> (3, 4)."""
    if n <= 0:
        return (0, 0)
    cols = math.ceil(math.sqrt(n))
    return (math.ceil(n / cols), cols)


def _finite_range(a: np.ndarray) -> tuple[float, float]:
    import numpy as np

    fin = a[np.isfinite(a)]
    if fin.size == 0:
        return (0.0, 1.0)
    lo, hi = float(fin.min()), float(fin.max())
    if hi <= lo:
        hi = lo + 1.0 if lo == 0 else lo + abs(lo) * 1e-3
    return lo, hi


def _per_tile(m: np.ndarray) -> np.ndarray:
    import numpy as np

    lo, hi = _finite_range(m)
    fin = m[np.isfinite(m)]
    if fin.size and float(fin.max()) == float(fin.min()):
        return np.zeros_like(m)  # a constant tile: no contrast to show
    return (m - lo) / (hi - lo)


def spatial_maps(sample: np.ndarray, channel_dim: int | None) -> tuple[str, np.ndarray, str]:
    """Classify one image's output: ``("grid", (C, H, W), note)``, ``("heatmap", (C, L), note)``
    with channels on the first axis, or ``("vector", (F,), note)``."""
    import numpy as np

    a = np.asarray(sample, dtype=np.float32)
    if a.ndim == 0:
        return "vector", a.reshape(1), ""
    if a.ndim == 1:
        return "vector", a, ""
    cd = 0 if channel_dim is None else channel_dim
    a = np.moveaxis(a, cd, 0)
    if a.ndim == 3:
        return "grid", a, ""
    if a.ndim == 4:
        return "grid", a.mean(axis=1), f"mean over {a.shape[1]} frames"
    if a.ndim > 4:
        return "grid", a.reshape(a.shape[0], -1, *a.shape[-2:]).mean(axis=1), \
            f"mean over the {a.ndim - 3} leading dims"
    # 2-D: (C, L) for Conv1d, (D, T) for tokens (channels last in the output).
    if channel_dim == 1:
        t = a.shape[1]
        for drop in (0, 1):
            side = math.isqrt(t - drop) if t - drop > 0 else 0
            if side > 1 and side * side == t - drop:
                note = f"{t - drop} tokens as a {side}x{side} grid" + (", class token dropped" if drop else "")
                return "grid", a[:, drop:].reshape(a.shape[0], side, side), note
    return "heatmap", a, ""


def render_activation(
    sample: np.ndarray,
    channel_dim: int | None,
    *,
    title: str,
    channels: ChannelSpec | None = None,
    scale: str = "layer",
    cmap: str = "viridis",
    layer: str = "",
) -> tuple[Image.Image, GridLayout]:
    """The picture for one image's output of one layer (``sample`` has no batch dim;
    ``channel_dim`` indexes ``sample``)."""
    import numpy as np

    if scale not in SCALES:
        raise UsageError(f"--scale '{scale}' is not one of {', '.join(SCALES)}")
    if np.ndim(sample) == 4:  # (C, T, h, w): a clip's feature maps, one column per frame
        from inspect_model.render.video import render_frame_grid

        return render_frame_grid(sample, channel_dim or 0, title=title, channels=channels, scale=scale, cmap=cmap,
                                 layer=layer)
    spec = channels or ChannelSpec()
    kind, a, note = spatial_maps(sample, channel_dim)
    if kind == "vector":
        idx = pick_channels(a.tolist(), spec, layer=layer) if (spec.top or spec.indices) else list(range(a.size))
        return _render_vector(a, idx, title=title, cmap=cmap, note=note)
    means = np.nanmean(a.reshape(a.shape[0], -1), axis=1) if a.size else np.zeros(a.shape[0])
    idx = pick_channels(means.tolist(), spec, layer=layer)
    if kind == "heatmap":
        return _render_heatmap(a, idx, title=title, cmap=cmap, scale=scale, note=note)
    return _render_grid(a, idx, title=title, cmap=cmap, scale=scale, note=note)


# ----------------------------------------------------------------------------- drawing
TILE_MIN, TILE_MAX = 40, 128  # a tile's long side on screen, pixels (integer scaling)
LABEL = 11  # font size of channel labels


def _scaled(tiles: np.ndarray) -> np.ndarray:
    """(n, h, w) values: small tiles repeated up to ``TILE_MIN`` px, large ones averaged
    down to ``TILE_MAX`` (integer factors only, so every source pixel stays a square)."""
    import numpy as np

    n, h, w = tiles.shape
    side = max(h, w, 1)
    if side < TILE_MIN:
        k = math.ceil(TILE_MIN / side)
        return np.repeat(np.repeat(tiles, k, axis=1), k, axis=2)
    if side > TILE_MAX:
        f = math.ceil(side / TILE_MAX)
        hh, ww = max(h // f, 1), max(w // f, 1)
        if h >= f and w >= f:
            return tiles[:, : hh * f, : ww * f].reshape(n, hh, f, ww, f).mean(axis=(2, 4))
    return tiles


def _scale_values(sel: np.ndarray, scale: str) -> tuple[np.ndarray, float, float, str]:
    """Values mapped to [0, 1] for the colormap, the colour bar range and its label."""
    import numpy as np

    if scale == "layer":
        vmin, vmax = _finite_range(sel)
        unit = (sel - vmin) / (vmax - vmin)
        return unit, vmin, vmax, "activation (shared scale)"
    unit = np.stack([_per_tile(t) for t in sel]) if len(sel) else sel
    return unit, 0.0, 1.0, "per tile: min 0, max 1"


def _side_panel(height: int, vmin: float, vmax: float, cmap: str, label: str, note: str) -> Image.Image:
    from inspect_model.render import raster

    if note:
        return raster.message_panel(110, max(height, 60), "no colour scale: " + note.split(":")[0])
    return raster.colorbar(max(height, 160), vmin, vmax, cmap, label)


def _render_grid(a: np.ndarray, idx: list[int], *, title: str, cmap: str, scale: str,
                 note: str) -> tuple[Image.Image, GridLayout]:
    """The tiles as one numpy canvas (one colormap lookup for all of them), the channel
    labels, title and colour bar drawn with Pillow: no matplotlib figure."""
    import numpy as np
    from PIL import Image, ImageDraw

    from inspect_model.render import raster

    n = len(idx)
    rows, cols = grid_shape(n)
    h, w = a.shape[1], a.shape[2]
    sel = a[idx] if n else a[:0]
    constant = raster.constant_note(sel)
    unit, vmin, vmax, label = _scale_values(sel, scale)
    rgb = raster.colorize(_scaled(unit), cmap) if n else np.zeros((0, 1, 1, 3), np.uint8)  # (n, th, tw, 3)
    th, tw = rgb.shape[1], rgb.shape[2]
    band, gap = LABEL + 3, 3
    cw, ch = max(tw, raster.text_size(str(max(idx, default=0)), LABEL)[0]) + gap, th + band + gap
    canvas = np.full((max(rows * ch, 1), max(cols * cw, 1), 3), 255, np.uint8)
    for k in range(n):
        r, c = divmod(k, cols)
        y, x = r * ch + band, c * cw + (cw - tw) // 2
        canvas[y: y + th, x: x + tw] = rgb[k]
    body = Image.fromarray(canvas, "RGB")
    d = ImageDraw.Draw(body)
    f = raster.font(LABEL)
    for k, channel in enumerate(idx):
        r, c = divmod(k, cols)
        d.text((c * cw + cw // 2, r * ch + band - 2), str(channel), font=f, fill=raster.FG, anchor="mb")
    side = _side_panel(body.size[1], vmin, vmax, cmap, label, constant)
    sub = f"{n} of {a.shape[0]} channels, {h}x{w}" + (f"; {note}" if note else "")
    img = raster.titled(body, [title, sub], right=side, note=constant)
    return img, GridLayout("grid", rows, cols, tuple(idx), a.shape[0], note)


def _axis_ticks(n: int, most: int) -> list[int]:
    step = max(1, math.ceil(n / most))
    for nice in (1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 50, 64, 100, 128, 200, 256, 500, 1000):
        if nice >= step:
            step = nice
            break
    return list(range(0, n, step))


def _matrix_image(values: np.ndarray, cmap: str, cell_w: int, cell_h: int, row_labels: list[tuple[int, str]],
                  col_labels: list[tuple[int, str]], x_title: str, y_title: str) -> Image.Image:
    """A (rows, cols) matrix of values in [0, 1] (NaN: grey) as cells, with labelled axes."""
    import numpy as np
    from PIL import Image, ImageDraw

    from inspect_model.render import raster

    rgb = raster.colorize(values, cmap)
    rgb[~np.isfinite(values)] = (225, 225, 225)
    rgb = np.repeat(np.repeat(rgb, cell_h, axis=0), cell_w, axis=1)
    mh, mw = rgb.shape[:2]
    fs = LABEL
    left = max((raster.text_size(t, fs)[0] for _, t in row_labels), default=0) + 6
    ytitle = raster.vertical_text(y_title, fs) if y_title else None
    yw = ytitle.size[0] + 4 if ytitle is not None else 0
    bottom = fs + 8 + (fs + 6 if x_title else 0)
    width, height = yw + left + mw + fs, mh + bottom + fs // 2
    img = Image.new("RGB", (width, height), raster.BG)
    x0, y0 = yw + left, fs // 2
    img.paste(Image.fromarray(rgb, "RGB"), (x0, y0))
    d = ImageDraw.Draw(img)
    f = raster.font(fs)
    for r, t in row_labels:
        if not t:
            continue
        y = y0 + r * cell_h + cell_h / 2
        d.line((x0 - 3, y, x0 - 1, y), fill=raster.FG)
        d.text((x0 - 5, y), t, font=f, fill=raster.FG, anchor="rm")
    for c, t in col_labels:
        x = x0 + c * cell_w + cell_w / 2
        d.line((x, y0 + mh, x, y0 + mh + 2), fill=raster.FG)
        d.text((x, y0 + mh + 4), t, font=f, fill=raster.FG, anchor="ma")
    if x_title:
        d.text((x0 + mw // 2, y0 + mh + fs + 8), x_title, font=f, fill=raster.FG, anchor="ma")
    if ytitle is not None:
        img.paste(ytitle, (0, max(0, y0 + mh // 2 - ytitle.size[1] // 2)))
    return img


def _render_heatmap(a: np.ndarray, idx: list[int], *, title: str, cmap: str, scale: str,
                    note: str) -> tuple[Image.Image, GridLayout]:
    """(C, L) outputs: one row of cells per channel, positions along x."""
    from inspect_model.render import raster

    sel = a[idx]  # (k, L): one row per channel
    constant = raster.constant_note(sel)
    unit, vmin, vmax, label = _scale_values(sel, scale)
    if scale == "each":
        label = "activation, per row (min 0, max 1)"
    k, length = unit.shape
    cell_w = max(1, min(24, 720 // max(length, 1)))
    cell_h = max(2, min(24, 420 // max(k, 1)))
    rows = [(i, str(idx[i])) for i in _axis_ticks(k, max(2, 420 // (LABEL + 4)))]
    cols = [(j, str(j)) for j in _axis_ticks(length, max(2, (length * cell_w) // 48))]
    body = _matrix_image(unit, cmap, cell_w, cell_h, rows, cols, "position (token / step)", "channel")
    side = _side_panel(body.size[1], vmin, vmax, cmap, label, constant)
    sub = f"{k} of {a.shape[0]} channels x {length} positions" + (f"; {note}" if note else "")
    img = raster.titled(body, [title, sub], right=side, note=constant)
    return img, GridLayout("heatmap", k, length, tuple(idx), a.shape[0], note)


def _render_vector(v: np.ndarray, idx: list[int], *, title: str, cmap: str,
                   note: str) -> tuple[Image.Image, GridLayout]:
    """1-D outputs (Linear): a heat-map strip, wrapped in rows of ``STRIP_WIDTH`` features."""
    import numpy as np

    from inspect_model.render import raster

    vals = v[idx].astype(np.float32)
    constant = raster.constant_note(vals)
    vmin, vmax = _finite_range(vals)
    n = len(idx)
    cols = max(1, min(n, STRIP_WIDTH))
    rows = max(1, math.ceil(n / cols))
    strip = np.full(rows * cols, np.nan, dtype=np.float32)
    strip[:n] = (vals - vmin) / (vmax - vmin)
    cell = max(8, min(40, 720 // cols))
    if rows == 1:
        row_labels = [(0, "")]
        col_labels = [(j, str(idx[j])) for j in _axis_ticks(n, max(2, (n * cell) // 36))]
        x_title, y_title = "feature", ""
    else:
        row_labels = [(r, str(idx[r * cols])) for r in _axis_ticks(rows, 40)]
        col_labels = [(j, f"+{j}") for j in _axis_ticks(cols, 16)]
        x_title, y_title = f"offset in the row (rows of {cols})", "first feature"
    body = _matrix_image(strip.reshape(rows, cols), cmap, cell, max(cell, 24) if rows == 1 else max(cell, 14),
                         row_labels, col_labels, x_title, y_title)
    side = _side_panel(body.size[1], vmin, vmax, cmap, "activation", constant)
    sub = f"{n} of {v.size} features" + (f"; {note}" if note else "")
    img = raster.titled(body, [title, sub], right=side, note=constant)
    return img, GridLayout("strip", rows, cols, tuple(idx), int(v.size), note)


def figure_to_array(img: Image.Image) -> Any:
    """The picture as an (H, W, 3) uint8 array (for TensorBoard images)."""
    import numpy as np

    return np.asarray(img.convert("RGB")).copy()
