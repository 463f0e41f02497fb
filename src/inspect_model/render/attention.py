"""Attention pictures: head grids on the patch grid, the layer-by-head mosaic and method
overlays on the image. Arrays in, PIL images out (Pillow and the
colormap tables of ``render.raster``; the same arrays give the same bytes).

- :func:`head_grid`: one layer, one cell per head (or per fused map), each the chosen query's
  attention over the patch grid, one colour scale for the layer (its smallest .. largest value);
- :func:`mosaic`: layers as rows, heads as columns, each row on its own scale (its maximum is
  written beside it: early layers attend more uniformly than late ones);
- :func:`method_overlay`: a rollout / grad-rollout / LeGrad map normalised to [0, 1], blown up
  from the patch grid to the input and laid over the original image (``render.overlay``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from inspect_model.output.files import class_tag, image_dir
from inspect_model.output.sink import Drawer, Sink
from inspect_model.render.labels import target_label
from inspect_model.reports.attention import AttentionImage, AttentionImageMap, AttentionReport
from inspect_model.reports.base import ABSENT

if TYPE_CHECKING:
    import numpy as np
    from PIL import Image

CELL = 96  # a patch-grid cell's side, pixels


def _cell(m: np.ndarray, vmax: float, cmap: str, side: int = CELL, vmin: float = 0.0) -> Image.Image:
    """(rows, cols) values -> a colour cell ``side`` px on its long side (nearest: patches stay square)."""
    import numpy as np
    from PIL import Image

    from inspect_model.render import raster

    a = (np.asarray(m, dtype=np.float32) - vmin) / (vmax - vmin if vmax > vmin else 1.0)
    img = Image.fromarray(raster.colorize(a, cmap), "RGB")
    h, w = a.shape
    s = side / max(h, w)
    return img.resize((max(1, round(w * s)), max(1, round(h * s))), Image.NEAREST)


def _label(text: str, width: int, height: int, size: int = 11, bold: bool = False) -> Image.Image:
    from PIL import Image, ImageDraw

    from inspect_model.render import raster

    img = Image.new("RGB", (width, height), raster.BG)
    lines = raster.wrap_text(text, size, width - 4, max_lines=3, bold=bold)
    d = ImageDraw.Draw(img)
    y0 = height // 2 - len(lines) * (size + 3) // 2
    for i, t in enumerate(lines):
        d.text((width // 2, y0 + i * (size + 3)), t, font=raster.font(size, bold), fill=raster.FG, anchor="ma")
    return img


def labelled_grid(cells: Sequence[Image.Image], labels: Sequence[str], columns: int, pad: int) -> Image.Image:
    """Equal-sized ``cells`` in rows of ``columns``, each under its label."""
    from PIL import Image

    from inspect_model.render import raster

    cw, ch = cells[0].size
    lab_h = 16
    cols = min(columns, len(cells))
    rows = -(-len(cells) // cols)
    body = Image.new("RGB", (cols * (cw + pad), rows * (ch + lab_h + pad)), raster.BG)
    for i, (c, lab) in enumerate(zip(cells, labels, strict=False)):
        x, y = (i % cols) * (cw + pad), (i // cols) * (ch + lab_h + pad)
        body.paste(_label(lab, cw, lab_h), (x, y))
        body.paste(c, (x, y + lab_h))
    return body


def head_grid(maps: np.ndarray, labels: Sequence[str], title: Sequence[str], *, cmap: str = "viridis",
              columns: int = 6) -> Image.Image:
    """``maps`` (heads, rows, cols) of one layer -> a grid of cells with one colour bar, from
    the layer's smallest to its largest value (windowed attention received is close to
    1 / window everywhere: a scale from 0 would show one flat colour)."""
    import numpy as np

    from inspect_model.render import raster

    maps = np.asarray(maps, dtype=np.float32)
    vmax = float(np.nanmax(maps)) if maps.size else 0.0
    vmin = float(np.nanmin(maps)) if maps.size else 0.0
    cells = [_cell(m, vmax, cmap, vmin=vmin) for m in maps]
    body = labelled_grid(cells, labels, columns, pad=4)
    bar = raster.colorbar(max(body.size[1], 120), vmin, vmax, cmap, "attention probability")
    return raster.titled(body, list(title), right=bar, note=raster.constant_note(maps))


def mosaic(maps: np.ndarray, layers: Sequence[str], title: Sequence[str], *, cmap: str = "viridis",
           side: int = 48) -> Image.Image:
    """``maps`` (layers, heads, rows, cols) -> rows of layers, columns of heads; each row
    scaled to its own maximum, written at its end."""
    import numpy as np
    from PIL import Image

    from inspect_model.render import raster

    maps = np.asarray(maps, dtype=np.float32)
    n_layers, n_heads = maps.shape[:2]
    first = _cell(maps[0, 0], 1.0, cmap, side)
    cw, ch = first.size
    pad, lab_w, max_w, head_h = 2, 150, 70, 16
    body = Image.new("RGB", (lab_w + n_heads * (cw + pad) + max_w, head_h + n_layers * (ch + pad)), raster.BG)
    for h in range(n_heads):
        body.paste(_label(f"h{h}", cw, head_h, 10), (lab_w + h * (cw + pad), 0))
    short = distinct(layers)
    for li in range(n_layers):
        y = head_h + li * (ch + pad)
        vmax = float(np.nanmax(maps[li])) if maps[li].size else 0.0
        body.paste(_label(f"{li}: {_short(short[li])}", lab_w, ch, 10), (0, y))
        for h in range(n_heads):
            body.paste(_cell(maps[li, h], vmax, cmap, side), (lab_w + h * (cw + pad), y))
        body.paste(_label(f"max {raster.tick_label(vmax)}", max_w, ch, 10), (lab_w + n_heads * (cw + pad), y))
    bar = raster.colorbar(body.size[1], 0.0, 1.0, cmap, "attention / row max")
    return raster.titled(body, list(title), right=bar)


def distinct(names: Sequence[str]) -> list[str]:
    """Layer names less the dotted parts they all share at either end
    (``encoder.layers.encoder_layer_3.self_attention`` -> ``encoder_layer_3``)."""
    parts = [n.split(".") for n in names]
    if len(parts) < 2:
        return list(names)
    lead = 0
    while all(len(p) > lead + 1 for p in parts) and len({p[lead] for p in parts}) == 1:
        lead += 1
    tail = 0
    while all(len(p) > lead + tail + 1 for p in parts) and len({p[-1 - tail] for p in parts}) == 1:
        tail += 1
    return [".".join(p[lead:len(p) - tail]) for p in parts]


def _short(name: str, most: int = 22) -> str:
    return name if len(name) <= most else "…" + name[-(most - 1):]


def normalise(m: np.ndarray) -> np.ndarray:
    """Min-max to [0, 1] (a constant map -> zeros)."""
    import numpy as np

    a = np.asarray(m, dtype=np.float32)
    lo, hi = float(np.nanmin(a)), float(np.nanmax(a))
    return (a - lo) / (hi - lo) if hi > lo else np.zeros_like(a)


def upsample(m: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """A patch-grid map blown up to the input's ``hw`` (bilinear)."""
    import numpy as np
    from PIL import Image

    img = Image.fromarray(np.asarray(m, dtype=np.float32), mode="F").resize((hw[1], hw[0]), Image.BILINEAR)
    return np.asarray(img)


def method_overlay(image: Image.Image, m: np.ndarray, hw: tuple[int, int], title: Sequence[str], *,
                   box: Sequence[float] | None = None, cmap: str = "jet", alpha: float = 0.5) -> Image.Image:
    """A method's patch-grid map, normalised and blown up to the input, over ``image``."""
    from inspect_model.render import raster
    from inspect_model.render.overlay import overlay

    norm = normalise(m)
    body = overlay(image, upsample(norm, hw), box, alpha=alpha, cmap=cmap)
    if max(body.size) > 512:
        body.thumbnail((512, 512))
    bar = raster.colorbar(body.size[1], 0.0, 1.0, cmap, "relevance (normalised)")
    return raster.titled(body, list(title), right=bar, note=raster.constant_note(m))


def side_by_side(image: Image.Image, maps: Sequence[tuple[str, np.ndarray]], hw: tuple[int, int], title: str,
                 row: str, *, box: Sequence[float] | None = None, cmap: str = "jet") -> Image.Image:
    """One row: each method's map (normalised to [0, 1]) over ``image``, captioned with its grid."""
    from inspect_model.render import raster
    from inspect_model.render.overlay import SheetCell, contact_sheet, overlay, thumbnail

    cells = [SheetCell(thumbnail(overlay(image, upsample(normalise(m), hw), box, alpha=0.5, cmap=cmap)),
                       f"{m.shape[0]}x{m.shape[1]} map" + (", constant" if raster.constant_note(m) else ""))
             for name, m in maps]
    sheet = contact_sheet([(row, cells)], [name for name, _ in maps], title=title)
    return raster.titled(sheet, [], right=raster.colorbar(sheet.size[1], 0.0, 1.0, cmap, "relevance (normalised)"))


def report_text(doc: Mapping[str, Any] | AttentionReport) -> str:
    """The plain-text report of an ``attention`` run, formatted from its typed records (the
    ``--json`` document is read into them)."""
    rep = doc if isinstance(doc, AttentionReport) else AttentionReport.from_dict(doc)
    lines = [f"attention of {rep.model}: {', '.join(rep.methods)}"]
    layers, grid = rep.layers, "x".join(str(g) for g in rep.grid or [])
    if layers and rep.text:
        lines.append(f"{len(layers)} attention layers ({layers[0]} .. {layers[-1]}), {rep.heads} heads, "
                     f"text of up to {rep.tokens} tokens" + (", causal" if rep.causal else ""))
    elif layers and rep.windowed:
        lines.append(f"{len(layers)} attention layers ({layers[0]} .. {layers[-1]}), windowed (Swin/MaxViT): "
                     "raw is what each token receives in its window, on each stage's feature map; rollout "
                     f"and grad-rollout lie on the first stage's {grid} map, LeGrad on the last stage's")
    elif layers:
        lines.append(f"{len(layers)} attention layers ({layers[0]} .. {layers[-1]}), {rep.heads} heads, "
                     f"{rep.tokens} tokens = {rep.prefix_tokens} prefix + {grid} patches")
    for img in rep.images:
        t = img.target
        what = f"  {target_label(t, prefix='class ')} p={t.probability:.3f}" if t else ""
        lines.append(f"[{img.index}] {img.image}{what}")
        for m in img.maps:
            if m.values is not ABSENT:
                lines.append(_text_line(img, m))
            elif m.method == "raw":
                heads = ", ".join(m.heads) if len(m.heads) <= 4 else f"{len(m.heads)} heads"
                lines.append(f"    raw {m.layer}: query {m.query}, {heads}, "
                             f"{m.grid[0]}x{m.grid[1]} tokens, max {m.max:.3g}")
            else:
                lines.append(f"    {m.method:<13} peak at patch (row {m.peak_cell[0]}, col {m.peak_cell[1]})")
    rows = rep.evaluation.average if rep.evaluation else []  # the evaluator's summary (run/evaluate.py)
    scores = [row.scores.to_dict() for row in rows]
    if rows:
        names = [k for k in ("deletion", "insertion", "road", "drop", "increase", "pointing", "energy")
                 if any(k in s for s in scores)]
        lines.append(f"faithfulness (mean over images; deletion and drop: lower is better, the rest higher): "
                     f"{', '.join(names)}")
        for row, got in zip(rows, scores):
            vals = "  ".join(f"{k} {got[k]:.3f}" if got.get(k) is not None else f"{k} -" for k in names)
            lines.append(f"  #{row.rank:.1f} {row.method:<13} {vals}" if row.rank is not None
                         else f"  {row.method:<13} {vals}")
    for w in rep.warnings:
        lines.append(f"warning: {w.message}")
    return "\n".join(lines) + "\n"


def _text_line(img: AttentionImage, m: AttentionImageMap) -> str:
    """A text's map: its peak token other than the query (raw: the query's attention, heads averaged)."""
    import numpy as np

    tokens = img.text.tokens if img.text else []
    v = np.asarray(m.values, dtype=np.float64)
    v = v.mean(axis=0) if v.ndim == 2 else v
    q = img.text.query if img.text and img.text.query is not ABSENT else None
    rest = v.copy()
    if q is not None and 0 <= q < v.size and v.size > 1:
        rest[q] = -np.inf  # the query's own share is the identity's in both rollouts
    peak = int(rest.argmax()) if v.size else 0
    tok = tokens[peak] if peak < len(tokens) else "?"
    what = f"raw {m.layer}: query {m.query}, " if m.method == "raw" else f"{m.method:<13} "
    return f"    {what}peak at token {peak} {tok!r} ({v[peak] if v.size else 0:.3g}), the query token aside"


def render_result(result: Any, rich: bool) -> Any:
    """The ``attention`` report on stdout (the registry entry's renderer)."""
    text = report_text(result.to_dict())
    return [text] if rich else text


class AttentionDrawer(Drawer):
    """The files of ``attention``, per image (``images/NNNN-stem/``): ``<method>.<class>.png``
    over the image, ``raw.<layer>.png`` head grids, ``mosaic.png``, and with ``save_raw`` the
    maps as ``.npy``."""

    def __init__(self, *, categories: list[str] | None, preprocess: Any, colormap: str, save_raw: bool,
                 query: str) -> None:
        self.categories, self.preprocess = categories, preprocess
        self.colormap, self.save_raw, self.query = colormap, save_raw, query

    def draw(self, item: Any, sink: Sink) -> dict[str, Any]:
        from inspect_model.render import overlay as ov
        from inspect_model.output.files import safe_name

        if item.data is None or sink.out is None:
            return item.entry.get("files", {})
        img, x, res, i = item.data
        entry, pre = item.entry, self.preprocess
        if img is not None:
            picture, box = ov.viewable(img.image, pre.uncrop_box(*img.image.size) if pre is not None else None)
        else:
            picture, box = ov.input_picture(x), None
        base = image_dir(entry["index"], entry["image"])
        t = entry["target"]
        what = f"{target_label(t, prefix='class ')} (p={t['probability']:.3f})" if t else ""
        tag = class_tag(t["class"], self.categories) if t else "all"
        for rec in entry["maps"]:
            method, layer = rec["method"], rec["layer"]
            if method != "raw":
                m = res.maps[method][i].numpy()
                fig = method_overlay(picture, m, res.input_hw, [f"{method}: {entry['image']}", what], box=box,
                                     cmap=self.colormap)
                rec["files"]["overlay"] = sink.image(f"{base}/{method}.{tag}.png", fig)
            else:
                m = res.raw[layer][i].numpy()
                desc = ("attention received, mean over each window's queries" if layer in res.windowed
                        else f"attention of query {self.query}")
                fig = head_grid(m, res.head_labels[layer], [
                    f"{layer}", f"{desc}, {m.shape[-2]}x{m.shape[-1]} tokens: {entry['image']}"])
                rec["files"]["grid"] = sink.image(f"{base}/raw.{safe_name(layer)}.png", fig)
            if self.save_raw:
                stem = f"{base}/{method}.{tag}" if method != "raw" else f"{base}/raw.{safe_name(layer)}"
                rec["files"]["raw"] = sink.npy(f"{stem}.npy", m)
        out: dict[str, Any] = {}
        methods = [r["method"] for r in entry["maps"] if r["method"] != "raw"]
        if len(methods) > 1:  # the methods side by side (issue 26: rollout beside Grad-CAM)
            fig = side_by_side(picture, [(m, res.maps[m][i].numpy()) for m in methods], res.input_hw,
                               f"{', '.join(methods)}: {entry['image']}", what or "all classes", box=box,
                               cmap=self.colormap)
            out["compare"] = sink.image(f"{base}/compare.{tag}.png", fig)
        if res.mosaic is not None:
            fig = mosaic(res.mosaic[i].numpy(), res.layers,
                         [f"attention of query {self.query}, every layer by every head", entry["image"]])
            out["mosaic"] = sink.image(f"{base}/mosaic.png", fig)
        return out
