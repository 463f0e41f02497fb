"""Heat-map pictures: colour-mapped overlays on the original image, bare maps with a colour
bar, and contact sheets. Pure functions: arrays and PIL images in, PIL images or matplotlib
figures out (the CLI saves them through ``OutputDir``, which strips PNG timestamps).

A map is computed on the model input (the resized, centre-cropped image); :func:`overlay`
draws it back on the *original* image through the crop box that
``Preprocess.uncrop_box`` gives, so the heat lands where the evidence was, and dims what the
model never saw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from inspect_model.errors import UsageError

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.figure import Figure
    from PIL import Image

FIG_DPI = 100
THUMB = 192  # contact-sheet cell side, pixels


def check_colormap(name: str) -> str:
    """``name`` if matplotlib knows the colormap, else a usage error listing a few."""
    import matplotlib

    if name not in matplotlib.colormaps:
        from inspect_model.errors import suggest

        raise UsageError(f"--colormap '{name}' is not a matplotlib colormap"
                         + (suggest(name, list(matplotlib.colormaps)) or "; e.g. jet, turbo, inferno, viridis"))
    return name


def colorize(m: np.ndarray, cmap: str = "jet") -> np.ndarray:
    """(H, W) values in [0, 1] -> (H, W, 3) uint8 RGB."""
    import matplotlib
    import numpy as np

    rgba = matplotlib.colormaps[cmap](np.clip(np.nan_to_num(m, nan=0.0), 0.0, 1.0))
    return (rgba[..., :3] * 255.0 + 0.5).astype(np.uint8)


def overlay(image: Image.Image, m: np.ndarray, box: Sequence[float] | None = None, *,
            alpha: float = 0.5, cmap: str = "jet", dim_outside: float = 0.45) -> Image.Image:
    """The map ``m`` (H, W) in [0, 1] blended over ``image`` (RGB or L).

    ``box`` (left, top, right, bottom) in ``image`` pixels is where the model input came
    from; ``None`` means the whole image. Pixels outside the box are dimmed by
    ``dim_outside`` (the model did not see them); the box may reach past the image edges."""
    import numpy as np
    from PIL import Image

    img = image.convert("RGB")
    width, height = img.size
    left, top, right, bottom = box if box is not None else (0.0, 0.0, float(width), float(height))
    bw, bh = max(round(right - left), 1), max(round(bottom - top), 1)
    # Resize the float map onto the box, then paste it at the box origin (clipped by PIL).
    resized = Image.fromarray(np.asarray(m, dtype=np.float32), mode="F").resize((bw, bh), Image.BILINEAR)
    values = Image.new("F", (width, height), 0.0)
    inside = Image.new("L", (width, height), 0)
    origin = (round(left), round(top))
    values.paste(resized, origin)
    inside.paste(Image.new("L", (bw, bh), 255), origin)
    v = np.asarray(values, dtype=np.float32)
    mask = np.asarray(inside, dtype=np.float32)[..., None] / 255.0
    base = np.asarray(img, dtype=np.float32)
    heat = colorize(v, cmap).astype(np.float32)
    blended = base * (1.0 - alpha) + heat * alpha
    outside = base * (1.0 - dim_outside)
    out = blended * mask + outside * (1.0 - mask)
    return Image.fromarray(np.clip(out + 0.5, 0, 255).astype(np.uint8), mode="RGB")


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


def heatmap_figure(m: np.ndarray, title: str, *, cmap: str = "jet") -> Figure:
    """The bare map (input resolution) with a colour bar saying what the colours mean."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.4, 3.8), dpi=FIG_DPI)
    ax = fig.add_axes((0.06, 0.06, 0.72, 0.80))
    im = ax.imshow(m, cmap=cmap, vmin=0.0, vmax=1.0, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title, fontsize=8)
    cax = fig.add_axes((0.82, 0.06, 0.04, 0.80))
    bar = fig.colorbar(im, cax=cax)
    bar.set_label("relevance (normalised to [0, 1])", fontsize=7)
    bar.ax.tick_params(labelsize=7)
    return fig


def thumbnail(image: Image.Image, side: int = THUMB) -> Image.Image:
    """A copy of ``image`` that fits in ``side`` x ``side`` (bounded memory for sheets)."""
    from PIL import Image

    t = image.copy()
    t.thumbnail((side, side), Image.BILINEAR)
    return t


@dataclass
class SheetCell:
    image: Image.Image  # a thumbnail
    title: str


def contact_sheet(rows: Sequence[tuple[str, Sequence[SheetCell | None]]], columns: Sequence[str],
                  title: str = "") -> Figure:
    """A grid: one row per (image, target), one column per (method, layer); each cell titled
    with its class name and score. Fixed size per cell, so the bytes depend on content only."""
    from matplotlib.figure import Figure

    n_rows, n_cols = len(rows), max(len(columns), 1)
    cell_w, cell_h = 2.2, 2.5
    fig = Figure(figsize=(cell_w * n_cols + 0.4, cell_h * n_rows + 0.6), dpi=FIG_DPI)
    if title:
        fig.suptitle(title, fontsize=9)
    gs = fig.add_gridspec(n_rows, n_cols, left=0.02, right=0.98, bottom=0.01,
                          top=1.0 - 0.6 / (cell_h * n_rows + 0.6), hspace=0.35, wspace=0.05)
    for r, (row_title, cells) in enumerate(rows):
        for ci in range(n_cols):
            ax = fig.add_subplot(gs[r, ci])
            ax.set_xticks([])
            ax.set_yticks([])
            cell = cells[ci] if ci < len(cells) else None
            if cell is not None:
                ax.imshow(cell.image, interpolation="nearest")
                head = f"{columns[ci]}\n" if r == 0 and ci < len(columns) else ""
                ax.set_title(f"{head}{cell.title}", fontsize=6)
            else:
                ax.axis("off")
            if ci == 0:
                ax.set_ylabel(row_title, fontsize=6)
    return fig
