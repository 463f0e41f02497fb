"""Attention pictures of text models (issue 26): arrays and tokens in, PIL images out.

- :func:`token_matrix`: one (queries x keys) map with the tokens along both sides;
- :func:`head_matrices`: one layer, one token matrix per head (or fused map), one colour scale;
- :func:`token_strips`: the tokens of a text in a row, each coloured by a per-token value
  (rollout or raw attention from the query token, grad-rollout or LeGrad relevance), one
  row per method, each row scaled to its largest value outside the query token;
- the same strips as HTML for report.html: :mod:`inspect_model.render.token_strips`.

:class:`TextDrawer` writes each text's files (:func:`draw_text`) in place of
:class:`~inspect_model.render.attention.AttentionDrawer`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from inspect_model.output.files import class_tag, image_dir, safe_name
from inspect_model.output.sink import Drawer, Sink
from inspect_model.render.token_strips import short_layer, strip_scale, token_label
from inspect_model.render.labels import target_label

if TYPE_CHECKING:
    import numpy as np
    from PIL import Image

LABELS_UP_TO = 64  # tokens named along a matrix's sides up to this length


def token_matrix(m: np.ndarray, tokens: Sequence[str], vmax: float, cmap: str, *, vmin: float = 0.0,
                 side: int = 240) -> Image.Image:
    """(L, L) values, queries down and keys across, with the tokens along the left and top."""
    import numpy as np
    from PIL import Image, ImageDraw

    from inspect_model.render import raster

    a = (np.asarray(m, dtype=np.float32) - vmin) / (vmax - vmin if vmax > vmin else 1.0)
    n = a.shape[0]
    px = max(3, min(24, side // max(n, 1)))
    heat = Image.fromarray(raster.colorize(a, cmap), "RGB").resize((a.shape[1] * px, n * px), Image.NEAREST)
    if n > LABELS_UP_TO:
        return heat
    size = max(7, min(11, px - 2))
    names = [token_label(t) for t in tokens[:n]]
    lab = max(raster.text_size(t, size)[0] for t in names) + 4 if names else 0
    img = Image.new("RGB", (lab + heat.size[0], lab + heat.size[1]), raster.BG)
    img.paste(heat, (lab, lab))
    d = ImageDraw.Draw(img)
    for i, t in enumerate(names):
        d.text((lab - 3, lab + i * px + px // 2), t, font=raster.font(size), fill=raster.FG, anchor="rm")
        up = raster.vertical_text(t, size)
        img.paste(up, (lab + i * px + (px - up.size[0]) // 2, lab - 2 - up.size[1]))
    return img


def head_matrices(maps: np.ndarray, tokens: Sequence[str], labels: Sequence[str], title: Sequence[str], *,
                  cmap: str = "viridis", columns: int = 4,
                  what: str = "attention probability (rows: queries)") -> Image.Image:
    """``maps`` (heads, L, L) of one layer -> one token matrix per head, one colour bar (0 .. max)."""
    import numpy as np

    from inspect_model.render import raster
    from inspect_model.render.attention import labelled_grid

    maps = np.asarray(maps, dtype=np.float32)
    vmax = float(np.nanmax(maps)) if maps.size else 0.0
    cells = [token_matrix(m, tokens, vmax, cmap) for m in maps]
    body = labelled_grid(cells, labels, columns, pad=8)
    bar = raster.colorbar(max(body.size[1], 120), 0.0, vmax, cmap, what)
    return raster.titled(body, list(title), right=bar, note=raster.constant_note(maps))


def token_strips(rows: Sequence[tuple[str, np.ndarray]], tokens: Sequence[str], title: Sequence[str], *,
                 cmap: str = "viridis", query: int | None = None) -> Image.Image:
    """One row per (label, (L,) values): the tokens as boxes coloured by value / the row's max."""
    import numpy as np
    from PIL import Image, ImageDraw

    from inspect_model.render import raster

    size, pad, box_h = 12, 3, 22
    names = [token_label(t, 16) for t in tokens]
    widths = [raster.text_size(t, size)[0] + 10 for t in names]
    lab_w = max([raster.text_size(r[0], size, True)[0] for r in rows] + [40]) + 10
    width = lab_w + sum(widths) + pad * len(widths)
    body = Image.new("RGB", (width, len(rows) * (box_h + 2 * pad) + 4), raster.BG)
    d = ImageDraw.Draw(body)
    lut = raster.colormap_lut(cmap)
    for r, (label, values) in enumerate(rows):
        y = r * (box_h + 2 * pad) + pad
        d.text((lab_w - 8, y + box_h // 2), label, font=raster.font(size, True), fill=raster.FG, anchor="rm")
        v = np.asarray(values, dtype=np.float32)
        top = strip_scale(v, query)
        x = lab_w
        for i, (t, w) in enumerate(zip(names, widths, strict=False)):
            rgb = tuple(int(c) for c in lut[raster.levels(np.clip(v[i:i + 1] / top, 0, 1))[0]])
            d.rectangle((x, y, x + w, y + box_h), fill=rgb, outline=(0, 0, 0) if i == query else rgb,
                        width=2 if i == query else 1)
            ink = (0, 0, 0) if 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] > 140 else (255, 255, 255)
            d.text((x + w // 2, y + box_h // 2), t, font=raster.font(size), fill=ink, anchor="mm")
            x += w + pad
    bar = raster.colorbar(max(body.size[1], 80), 0.0, 1.0, cmap, "value / row max")  # (query token aside)
    note = "" if query is None else f"outlined: the query token ({query}: {token_label(tokens[query], 16)})"
    return raster.titled(body, list(title), right=bar, note=note)


def draw_text(drawer: Any, item: Any, sink: Sink) -> dict[str, Any]:
    """One text's files: ``raw.<layer>.png`` (token matrices per head), ``<method>.<class>.png``
    (rollout's and grad-rollout's tokens x tokens matrix), ``strips.png``, ``mosaic.png``."""
    import numpy as np

    data, entry = item.data, item.entry
    res, i = data.result, data.index
    n = res.lengths[i]
    tokens = entry["text"]["tokens"]
    base = image_dir(entry["index"], entry["image"])
    t = entry["target"]
    what = f"{target_label(t, prefix='class ')} (p={t['probability']:.3f})" if t else ""
    tag = class_tag(t["class"], drawer.categories) if t else "all"
    cmap = "viridis" if drawer.colormap == "jet" else drawer.colormap  # jet: the overlays' default
    strips: list[tuple[str, Any]] = []
    for rec in entry["maps"]:
        method, layer = rec["method"], rec["layer"]
        if method == "raw":
            m = res.raw[layer][i, :, :n, :n].numpy()
            title = [layer, f"attention, queries x keys: {entry['image']}"]
            fig = head_matrices(m, tokens, res.head_labels[layer], title, cmap=cmap)
            rec["files"]["grid"] = sink.image(f"{base}/raw.{safe_name(layer)}.png", fig)
            strips.append((f"raw {short_layer(layer)}", m.mean(axis=0)[res.queries[i]]))
            stem = f"{base}/raw.{safe_name(layer)}"
        else:
            strips.append((method, res.values[method][i, :n].numpy()))
            m = res.matrices[method][i, :n, :n].numpy() if method in res.matrices else res.values[method][i, :n].numpy()
            if method in res.matrices:
                fig = head_matrices(m[None], tokens, [f"{method}, tokens x tokens"], [f"{method}: {entry['image']}",
                                                                                       what], cmap=cmap,
                                    what=f"{method} (rows: queries)")
                rec["files"]["matrix"] = sink.image(f"{base}/{method}.{tag}.png", fig)
            stem = f"{base}/{method}.{tag}"
        if drawer.save_raw:
            rec["files"]["raw"] = sink.npy(f"{stem}.npy", np.asarray(m))
    out: dict[str, Any] = {}
    if strips:
        q = res.queries[i]
        fig = token_strips(strips, tokens, [f"per-token values: {entry['image']}", what or
                                            f"from query token {q}"], cmap=cmap, query=q)
        out["strips"] = sink.image(f"{base}/strips.png", fig)
    if res.mosaic is not None:  # every layer by every head: one strip each, the query's attention
        names = [short_layer(n) for n in res.layers]
        rows = [(f"{names[li]} h{h}", res.mosaic[i, li, h, :n].numpy()) for li in range(res.mosaic.shape[1])
                for h in range(res.mosaic.shape[2])]
        out["mosaic"] = sink.image(f"{base}/mosaic.png", token_strips(rows, tokens, [
            f"attention of query token {res.queries[i]}, every layer (rows: layer, head)", entry["image"]],
            cmap=cmap, query=res.queries[i]))
    return out


class TextDrawer(Drawer):
    """The attention drawer of a text run: each text's files (:func:`draw_text`)."""

    def __init__(self, base: Any) -> None:
        self.base = base
        self.categories, self.colormap, self.save_raw = base.categories, base.colormap, base.save_raw

    def draw(self, item: Any, sink: Sink) -> dict[str, Any]:
        if item.data is None or sink.out is None:
            return item.entry.get("files", {})
        if not hasattr(item.data, "result"):  # an image of a model that also reads token ids
            return self.base.draw(item, sink)
        return draw_text(self, item, sink)
