"""Feature-map figures: one layer's output for one image, as a matplotlib figure.

A (C, H, W) output becomes a near-square grid of C tiles (64 channels: 8x8), each titled
with its channel index, drawn with one colour map and one colour bar. ``scale="layer"``
shares one value range across the tiles (the colour bar is in activation units);
``scale="each"`` stretches every tile to its own min..max (the colour bar reads 0..1).
Token outputs (T, D) of ViT-like models become a grid of D maps when the tokens (after
dropping a class token) form a square; other 2-D outputs (Conv1d (C, L), tokens that do
not form a square) are a heat map; 1-D outputs (Linear) are a bar chart or, when long, a
heat-map strip wrapped in rows of 64. A 5-D (C, T, H, W) output is averaged over T.

Renderers are pure: numpy arrays in, a ``Figure`` out (Agg, fixed size for a given layout,
no timestamps: saved through ``OutputDir.save_figure`` the PNG bytes are reproducible).
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
    from matplotlib.figure import Figure

DPI = 100
SCALES = ("each", "layer")
BAR_LIMIT = 128  # 1-D outputs up to this length are bars, longer ones a wrapped strip
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


def _new_figure(w: float, h: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(round(w, 2), round(h, 2)), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


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
) -> tuple[Figure, GridLayout]:
    """The figure for one image's output of one layer (``sample`` has no batch dim;
    ``channel_dim`` indexes ``sample``)."""
    import numpy as np

    if scale not in SCALES:
        raise UsageError(f"--scale '{scale}' is not one of {', '.join(SCALES)}")
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


def _colorbar(fig: Figure, rect: Sequence[float], vmin: float, vmax: float, cmap: str, label: str) -> None:
    from matplotlib import cm, colors

    cax = fig.add_axes(list(rect))
    sm = cm.ScalarMappable(norm=colors.Normalize(vmin=vmin, vmax=vmax), cmap=cmap)
    cb = fig.colorbar(sm, cax=cax)
    cb.set_label(label, fontsize=8)
    cb.ax.tick_params(labelsize=7)


def _render_grid(a: np.ndarray, idx: list[int], *, title: str, cmap: str, scale: str,
                 note: str) -> tuple[Figure, GridLayout]:
    n = len(idx)
    rows, cols = grid_shape(n)
    h, w = a.shape[1], a.shape[2]
    aspect = min(max(h / max(w, 1), 0.25), 4.0)  # tile height in tile widths
    band, gap = 0.3, 0.1  # label band above a tile, gap between tiles (tile widths)
    unit = min(1.0, 12.0 / max(cols, 1), 12.0 / max(rows * (aspect + band + gap), 1e-9))
    grid_w, grid_h = cols * (1 + gap), rows * (aspect + band + gap)
    right_in, top_in, bottom_in = 1.3, 0.75, 0.2
    gw_in, gh_in = grid_w * unit, grid_h * unit
    plot_h = max(gh_in, 2.6)  # room for a readable colour bar under small grids
    left_in = max(0.2, (5.0 - right_in - gw_in) / 2)  # centre small grids in a 5-inch figure
    fig_w = gw_in + left_in + right_in
    fig_h = plot_h + top_in + bottom_in
    fig = _new_figure(fig_w, fig_h)
    ax = fig.add_axes([left_in / fig_w, (bottom_in + plot_h - gh_in) / fig_h, gw_in / fig_w, gh_in / fig_h])
    ax.set_xlim(0, grid_w)
    ax.set_ylim(0, grid_h)
    ax.set_axis_off()
    sel = a[idx] if n else a[:0]
    if scale == "layer":
        vmin, vmax = _finite_range(sel)
        label = "activation (shared scale)"
    else:
        vmin, vmax = 0.0, 1.0
        label = "per tile: min 0, max 1"
    fontsize = max(4.0, min(8.0, 9.0 * unit))
    for k, ch in enumerate(idx):
        r, c = divmod(k, cols)
        x0 = c * (1 + gap) + gap / 2
        y_top = grid_h - r * (aspect + band + gap) - band - gap / 2
        tile = sel[k] if scale == "layer" else _per_tile(sel[k])
        ax.imshow(tile, extent=(x0, x0 + 1, y_top - aspect, y_top), origin="upper", cmap=cmap,
                  vmin=vmin, vmax=vmax, interpolation="nearest", aspect="auto")
        ax.text(x0 + 0.5, y_top + band * 0.15, str(ch), ha="center", va="bottom", fontsize=fontsize)
    _colorbar(fig, [(fig_w - right_in + 0.25) / fig_w, bottom_in / fig_h, 0.18 / fig_w,
                    plot_h / fig_h], vmin, vmax, cmap, label)
    sub = f"{n} of {a.shape[0]} channels, {h}x{w}" + (f"; {note}" if note else "")
    fig.suptitle(f"{title}\n{sub}", fontsize=9, y=1 - 0.08 / fig_h)
    return fig, GridLayout("grid", rows, cols, tuple(idx), a.shape[0], note)


def _render_heatmap(a: np.ndarray, idx: list[int], *, title: str, cmap: str, scale: str,
                    note: str) -> tuple[Figure, GridLayout]:
    import numpy as np

    sel = a[idx]  # (k, L): one row per channel
    if scale == "each":
        sel = np.stack([_per_tile(r) for r in sel]) if len(idx) else sel
        vmin, vmax, label = 0.0, 1.0, "activation, per row (min 0, max 1)"
    else:
        vmin, vmax = _finite_range(sel)
        label = "activation (shared scale)"
    fig = _new_figure(10.0, 6.0)
    ax = fig.add_axes([0.1, 0.1, 0.72, 0.76])
    ax.imshow(sel, aspect="auto", cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest")
    ax.set_xlabel("position (token / step)", fontsize=8)
    ax.set_ylabel("channel", fontsize=8)
    step = max(1, math.ceil(len(idx) / 32))
    ax.set_yticks(range(0, len(idx), step))
    ax.set_yticklabels([str(idx[i]) for i in range(0, len(idx), step)], fontsize=6)
    ax.tick_params(axis="x", labelsize=7)
    _colorbar(fig, [0.86, 0.1, 0.025, 0.76], vmin, vmax, cmap, label)
    fig.suptitle(f"{title}\n{len(idx)} of {a.shape[0]} channels x {a.shape[1]} positions", fontsize=9)
    return fig, GridLayout("heatmap", len(idx), a.shape[1], tuple(idx), a.shape[0], note)


def _render_vector(v: np.ndarray, idx: list[int], *, title: str, cmap: str,
                   note: str) -> tuple[Figure, GridLayout]:
    import numpy as np
    from matplotlib import colormaps, colors

    vals = v[idx]
    vmin, vmax = _finite_range(vals)
    fig = _new_figure(10.0, 4.0 if len(idx) <= BAR_LIMIT else 6.0)
    if len(idx) <= BAR_LIMIT:
        ax = fig.add_axes([0.08, 0.15, 0.76, 0.68])
        norm = colors.Normalize(vmin=vmin, vmax=vmax)
        finite = np.where(np.isfinite(vals), vals, 0.0)
        ax.bar(range(len(idx)), finite, color=colormaps[cmap](norm(finite)), width=0.85)
        ax.axhline(0.0, color="black", linewidth=0.5)
        step = max(1, math.ceil(len(idx) / 32))
        ax.set_xticks(range(0, len(idx), step))
        ax.set_xticklabels([str(idx[i]) for i in range(0, len(idx), step)], fontsize=6,
                           rotation=90 if len(idx) > 16 else 0)
        ax.set_xlabel("feature", fontsize=8)
        ax.set_ylabel("activation", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        kind, rows, cols = "bars", 1, len(idx)
        cb_rect = [0.87, 0.15, 0.025, 0.68]
    else:
        cols = STRIP_WIDTH
        rows = math.ceil(len(idx) / cols)
        strip = np.full(rows * cols, np.nan, dtype=np.float32)
        strip[: len(idx)] = vals
        ax = fig.add_axes([0.1, 0.1, 0.72, 0.74])
        ax.imshow(strip.reshape(rows, cols), aspect="auto", cmap=cmap, vmin=vmin, vmax=vmax,
                  interpolation="nearest")
        ax.set_yticks(range(rows))
        ax.set_yticklabels([str(idx[r * cols]) for r in range(rows)], fontsize=6)
        ax.set_ylabel("first feature of row", fontsize=8)
        ax.set_xlabel(f"+ offset (rows of {cols})", fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        kind = "strip"
        cb_rect = [0.86, 0.1, 0.025, 0.74]
    _colorbar(fig, cb_rect, vmin, vmax, cmap, "activation")
    fig.suptitle(f"{title}\n{len(idx)} of {v.size} features", fontsize=9)
    return fig, GridLayout(kind, rows, cols, tuple(idx), int(v.size), note)


def figure_to_array(fig: Figure) -> Any:
    """The figure as an (H, W, 3) uint8 array (for TensorBoard images)."""
    import numpy as np

    canvas = fig.canvas
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()
