"""Pictures of clips: maps over time as a strip of frames and as an animated overlay, and
per-frame grids of a clip's feature maps.

A clip's map is (T, H, W) over the model input's frames; each frame's map is blended on the
matching display frame through the crop box (as :func:`.overlay.overlay` does for images).
:func:`clip_strip` lays the overlays in rows of at most :data:`STRIP_COLS` frames, each
labelled with its frame index and time; :func:`animated_overlay` writes them as a looping
GIF at the video's rate. :func:`render_frame_grid` draws a (C, T, h, w) layer output with one
row per channel and one column per frame, on one colour scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from PIL import Image

STRIP_COLS = 8  # frames per row of a strip
STRIP_SIDE = 160  # a strip frame's long side, pixels
STRIP_LEAST = 96  # smaller frames (a 32-pixel clip) are enlarged to this, so that their labels fit
GIF_LEAST = 160  # the same for the animation's frames
GRID_FRAMES = 16  # frames drawn per channel row (more are sampled evenly)
GRID_CHANNELS = 16  # channel rows drawn at most


def clip_frames(clip: Any, x: Any = None, mean: Sequence[float] | None = None,
                std: Sequence[float] | None = None) -> list[Image.Image]:
    """The frames to draw on: a decoded clip's display copies, or the model input (C, T, H, W)
    turned back into pictures (synthetic clips)."""
    if clip is not None and getattr(clip, "frames", None):
        return list(clip.frames)
    from inspect_model.render.overlay import input_picture

    return [input_picture(x[:, t], mean, std) for t in range(int(x.shape[1]))]


def frame_labels(clip: Any, t: int) -> list[str]:
    """``frame 17 1.70s`` per frame of the clip (``t`` frames when it is synthetic)."""
    if clip is None or not getattr(clip, "frame_indices", None):
        return [f"t={i}" for i in range(t)]
    return [f"frame {i}" + (f" {s:.2f}s" if s is not None else "") for i, s in zip(clip.frame_indices, clip.times)]


def frame_overlays(frames: Sequence[Image.Image], maps: np.ndarray, box: Sequence[float] | None, *,
                   alpha: float, cmap: str) -> list[Image.Image]:
    """Each frame with its map (maps (T, H, W) in [0, 1]; one map per frame)."""
    from inspect_model.render.overlay import overlay

    t = maps.shape[0]
    if len(frames) != t:  # the map's T follows the input's: pick the frame under each map
        frames = [frames[min(len(frames) - 1, round(i * len(frames) / t))] for i in range(t)]
    return [overlay(f, maps[i], box, alpha=alpha, cmap=cmap) for i, f in enumerate(frames)]


def clip_strip(overlays: Sequence[Image.Image], labels: Sequence[str], title: Sequence[str],
               *, cmap: str = "jet", bar: str = "map (clip max = 1)") -> Image.Image:
    """The overlays in rows of :data:`STRIP_COLS`, labelled, with a title and a colour bar."""
    from PIL import Image, ImageDraw

    from inspect_model.render import raster

    thumbs = [_fit(o, STRIP_SIDE, least=STRIP_LEAST) for o in overlays]
    tw, th = max(t.size[0] for t in thumbs), max(t.size[1] for t in thumbs)
    lines = [label_lines(lab, 10, tw) for lab in labels]
    band, gap = 2 + 12 * max((len(x) for x in lines), default=1), 4
    cols = min(STRIP_COLS, len(thumbs))
    rows = -(-len(thumbs) // cols)
    body = Image.new("RGB", (cols * (tw + gap) + gap, rows * (th + band + gap) + gap), (255, 255, 255))
    d = ImageDraw.Draw(body)
    f = raster.font(10)
    for k, (t, lab) in enumerate(zip(thumbs, lines)):
        r, c = divmod(k, cols)
        x, y = gap + c * (tw + gap), gap + r * (th + band + gap)
        for j, text in enumerate(lab):
            d.text((x + tw // 2, y + band - 2 - 12 * (len(lab) - 1 - j)), text, font=f, fill=raster.FG, anchor="mb")
        body.paste(t, (x, y + band))
    side = raster.colorbar(max(body.size[1], 160, raster.text_size(bar, 11)[0] + 12), 0.0, 1.0, cmap, bar)
    return raster.titled(body, list(title), right=side)


def animated_overlay(overlays: Sequence[Image.Image], labels: Sequence[str], fps: float | None) -> bytes:
    """A looping GIF of the overlays, each frame labelled, at the video's rate (8 fps when
    unknown; at least 20 ms a frame, the floor browsers keep)."""
    import io

    from PIL import ImageDraw

    from inspect_model.render import raster

    frames = []
    for o, lab in zip(overlays, labels):
        im = _fit(o, 320, least=GIF_LEAST).copy()
        lines = label_lines(lab, 11, im.size[0] - 6)
        d = ImageDraw.Draw(im)
        d.rectangle((0, 0, max(raster.text_size(t, 11)[0] for t in lines) + 6, 2 + 13 * len(lines)), fill=(0, 0, 0))
        for j, text in enumerate(lines):
            d.text((3, 2 + 13 * j), text, font=raster.font(11), fill=(255, 255, 255))
        frames.append(im.convert("P", palette=1, colors=255))  # 1: Image.Palette.ADAPTIVE
    buf = io.BytesIO()
    duration = max(20, round(1000 / fps)) if fps else 125
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:], duration=duration, loop=0,
                   optimize=False, disposal=1)
    return buf.getvalue()


def _fit(img: Image.Image, side: int, *, least: int = 0) -> Image.Image:
    """``img`` shrunk to ``side`` pixels on its long side, or a smaller one enlarged by a whole
    factor (pixels kept square, no blur) to at least ``least``."""
    from PIL import Image

    w, h = img.size
    if max(w, h) < least:
        k = -(-least // max(w, h))
        return img.resize((w * k, h * k), Image.NEAREST)
    s = side / max(w, h)
    if s >= 1:
        return img
    return img.resize((max(1, round(w * s)), max(1, round(h * s))), Image.BILINEAR)


def label_lines(label: str, size: int, width: int) -> list[str]:
    """``frame 17 1.70s`` as one line when it fits ``width`` pixels, else as ``frame 17`` over
    ``1.70s``, each shortened only if it still does not fit."""
    from inspect_model.render import raster

    if raster.text_size(label, size)[0] <= width or label.count(" ") < 2:
        return [raster.fit_text(label, size, width)]
    head, tail = label.rsplit(" ", 1)
    return [raster.fit_text(head, size, width), raster.fit_text(tail, size, width)]


def clip_map_job(sink: Any, names: dict[str, Any], clip: Any, x: Any, maps: np.ndarray, box: Any, *,
                 alpha: float, cmap: str, title: str, mean: Sequence[float] | None = None,
                 std: Sequence[float] | None = None) -> Any:
    """A worker's job for one clip map: the strip PNG and the animated GIF written under
    ``names`` (``strip``, ``animation``); gives (contact-sheet thumbnail, None)."""
    from inspect_model.output.files import png_bytes
    from inspect_model.render.overlay import thumbnail

    def job() -> tuple[Any, Any]:
        frames = clip_frames(clip, x, mean, std)
        overlays = frame_overlays(frames, maps, None if clip is None else box, alpha=alpha, cmap=cmap)
        labels = frame_labels(clip, len(overlays)) if len(overlays) == len(frames) else \
            [f"t={i}" for i in range(len(overlays))]
        if names and sink.out is not None:
            strip = clip_strip(overlays, labels, title.split("\n"), cmap=cmap)
            sink.out.write_staged(*names["strip"], png_bytes(strip, photo=True))
            sink.out.write_staged(*names["animation"], animated_overlay(overlays, labels, getattr(clip, "fps", None)))
        return thumbnail(overlays[len(overlays) // 2]), None

    return job


def render_frame_grid(sample: np.ndarray, channel_dim: int, *, title: str, channels: Any = None,
                      scale: str = "layer", cmap: str = "viridis", layer: str = "",
                      note: str = "") -> tuple[Image.Image, Any]:
    """A (C, T, h, w) output (channels at ``channel_dim``) as rows of channels and columns of
    frames, on one shared colour scale (``--scale tile``: each tile its own); ``note``: how the
    output was laid out on the grid (tokens), under the title and in the layout's note."""
    import numpy as np
    from PIL import Image, ImageDraw

    from inspect_model.render import raster
    from inspect_model.render.grids import ChannelSpec, GridLayout, _per_tile, _scaled, pick_channels

    a = np.moveaxis(np.asarray(sample, dtype=np.float32), channel_dim, 0)  # (C, T, h, w)
    c, t = a.shape[0], a.shape[1]
    spec = channels or ChannelSpec()
    means = np.nanmean(a.reshape(c, -1), axis=1) if a.size else np.zeros(c)
    idx = pick_channels(means.tolist(), spec, layer=layer)[:GRID_CHANNELS]
    m = min(t, GRID_FRAMES)
    frames = sorted({round(i * (t - 1) / max(m - 1, 1)) for i in range(m)})  # evenly spread over the layer's T
    sel = a[idx][:, frames]  # (n, f, h, w)
    constant = raster.constant_note(sel)
    if scale == "layer":
        fin = sel[np.isfinite(sel)]
        vmin, vmax = (float(fin.min()), float(fin.max())) if fin.size else (0.0, 1.0)
        unit = (sel - vmin) / (vmax - vmin) if vmax > vmin else np.zeros_like(sel)
        label = "activation (shared scale)"
    else:
        unit = np.stack([np.stack([_per_tile(m) for m in row]) for row in sel]) if len(sel) else sel
        vmin, vmax, label = 0.0, 1.0, "per tile: min 0, max 1"
    n, f, h, w = unit.shape
    tiles = raster.colorize(_scaled(np.nan_to_num(unit).reshape(n * f, h, w)), cmap)  # (n*f, th, tw, 3)
    th, tw = tiles.shape[1], tiles.shape[2]
    lab_w, band, gap = 40, 14, 2
    canvas = np.full((band + n * (th + gap) + gap, lab_w + f * (tw + gap) + gap, 3), 255, np.uint8)
    for r in range(n):
        for k in range(f):
            y, x = band + r * (th + gap), lab_w + k * (tw + gap)
            canvas[y:y + th, x:x + tw] = tiles[r * f + k]
    body = Image.fromarray(canvas, "RGB")
    d = ImageDraw.Draw(body)
    font = raster.font(10)
    for k, fr in enumerate(frames):
        d.text((lab_w + k * (tw + gap) + tw // 2, band - 2), f"t{fr}", font=font, fill=raster.FG, anchor="mb")
    for r, ch in enumerate(idx):
        d.text((lab_w - 4, band + r * (th + gap) + th // 2), f"ch {ch}", font=font, fill=raster.FG, anchor="rm")
    side = raster.colorbar(max(body.size[1], 160), vmin, vmax, cmap, label)
    sub = f"{n} of {c} channels x {len(frames)} of {t} frames, {h}x{w} each"
    img = raster.titled(body, [title, sub] + ([note] if note else []), right=side, note=constant)
    return img, GridLayout("frames", n, len(frames), tuple(idx), c,
                           f"{len(frames)} of {t} frames" + (f"; {note}" if note else ""))


class _ClipLabels:
    """Frame indices and times of a report entry's ``clip`` record, for labels only."""

    def __init__(self, rec: dict[str, Any] | None) -> None:
        self.frame_indices = list(rec["frames"]) if rec else []
        self.times = list(rec.get("times") or [None] * len(self.frame_indices)) if rec else []
        self.fps = rec.get("fps") if rec else None
        self.frames: list[Any] = []


def guided_clip_files(sink: Any, base: str, tag: str, grad: Any, x: Any, entry: dict[str, Any], *,
                      mean: Sequence[float] | None, std: Sequence[float] | None) -> dict[str, Any]:
    """Guided backprop of a clip (C, T, H, W): the gradient frames as a strip (one display
    normalisation for the clip), and its magnitude (sum over channels of |g| over the clip's
    99th percentile) over the input frames as a strip and an animated overlay."""
    import numpy as np

    from inspect_model.render.saliency import display_image, magnitude

    labels_from = _ClipLabels(entry.get("clip"))
    t = int(grad.shape[1])
    mag = magnitude(grad.reshape(grad.shape[0], t * grad.shape[2], grad.shape[3]))  # one scale for the clip
    mag = mag.reshape(t, grad.shape[2], grad.shape[3]).astype(np.float32)
    files: dict[str, Any] = {}
    flat = display_image(grad.reshape(grad.shape[0], t * grad.shape[2], grad.shape[3]))  # frames stacked
    h = grad.shape[2]
    frames = [flat.crop((0, i * h, flat.size[0], (i + 1) * h)) for i in range(t)]
    labels = frame_labels(labels_from if labels_from.frame_indices else None, t)
    strip = clip_strip(frames, labels, [f"guided backprop: {tag}"], cmap="gray",
                       bar="gradient, 0.5 = 0 (one scale per clip)")
    files["guided_strip"] = sink.image(f"{base}/guided.{tag}.strip.png", strip)
    names = {k: sink.out.reserve(f"{base}/magnitude.{tag}.{ext}")
             for k, ext in (("strip", "strip.png"), ("animation", "overlay.gif"))}
    job = clip_map_job(sink, names, labels_from if labels_from.frame_indices else None, x, mag, None,
                       alpha=0.5, cmap="jet", title=f"|guided backprop|: {tag}", mean=mean, std=std)
    sink.defer(job)
    files["magnitude_strip"] = sink.relative(names["strip"][1])
    files["magnitude_animation"] = sink.relative(names["animation"][1])
    return files
