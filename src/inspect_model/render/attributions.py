"""Attribution pictures and records: heat maps (signed maps on a diverging colormap centred
on 0, unsigned ones on a sequential one), overlays on the input, a contact sheet of images
x methods, and the per-map statistics of the report. Pure functions: tensors and dicts in,
PIL images and dicts out (``render.raster`` and ``render.overlay`` draw).

A map of an image input (C, H, W) is shown as its channel sum (captum's
``visualize_image_attr`` sign "all"), scaled by the 99.5th percentile of its magnitude
so that a few extreme pixels do not wash the rest out (the colour bar says the scale, in
the map's own units). A map of token embeddings (L, D) is shown as one cell per token (the
sum over D).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from inspect_model.render.labels import target_label
from inspect_model.render.table import Column, plain_table, rich_table, warning_text
from inspect_model.reports.attributions import AttributionsReport, Sanity
from inspect_model.reports.base import ABSENT

if TYPE_CHECKING:
    import numpy as np
    import torch
    from PIL import Image

SIGNED_CMAP = "RdBu_r"  # red: raises the score, blue: lowers it, white: 0
UNSIGNED_CMAP = "inferno"
PERCENTILE = 99.5


def reduce_map(m: torch.Tensor) -> np.ndarray:
    """(C, H, W) -> (H, W) channel sum; (L, D) -> (1, L) per-token sum; (F,) -> (1, F)."""
    import numpy as np

    a = m.detach().double().cpu().numpy()
    if a.ndim == 3:
        return a.sum(0)
    if a.ndim == 2 and a.shape[0] > 1 and a.shape[1] > 1 and a.shape[0] < a.shape[1]:
        return a.sum(1)[None, :]  # (L, D): a row of tokens
    if a.ndim >= 2:
        return a.reshape(a.shape[0], -1).sum(1)[None, :]
    return a.reshape(1, -1)


def scale_of(a: np.ndarray) -> float:
    """The display scale: the 99.5th percentile of |a| (its maximum when that is 0)."""
    import numpy as np

    mag = np.abs(a[np.isfinite(a)])
    if mag.size == 0:
        return 0.0
    s = float(np.percentile(mag, PERCENTILE))
    return s if s > 0 else float(mag.max())


def normalised(a: np.ndarray, signed: bool) -> tuple[np.ndarray, float]:
    """Values in [0, 1] for a colormap, and the scale: signed maps map [-s, s] onto [0, 1]
    (0 at 0.5, the colormap's centre), unsigned ones [0, s]."""
    import numpy as np

    s = scale_of(a)
    if s <= 0:
        return np.full(a.shape, 0.5 if signed else 0.0, dtype=np.float32), 0.0
    v = np.clip(a / s, -1.0 if signed else 0.0, 1.0)
    return ((v + 1.0) / 2.0 if signed else v).astype(np.float32), s


def heatmap(m: torch.Tensor, title: str, *, signed: bool, side: int = 224,
            tokens: Sequence[str] | None = None) -> Image.Image:
    """The bare map, titled, with a colour bar in the map's units; a token map (L, D) with
    each token written under its cell (``tokens``, issue 42)."""
    from PIL import Image

    from inspect_model.render import raster

    a = reduce_map(m)
    v, s = normalised(a, signed)
    cmap = SIGNED_CMAP if signed else UNSIGNED_CMAP
    body = Image.fromarray(raster.colorize(v, cmap), "RGB")
    h, w = a.shape
    if h == 1:  # tokens: cells of at least 24 px, a strip 40 px tall
        cell = max(24, math.ceil(side / max(w, 1)))
        body = body.resize((w * cell, 40), Image.NEAREST)
        if tokens:
            body = _token_row(body, [str(t) for t in tokens][:w], cell)
    else:
        k = max(1, math.ceil(side / max(h, w, 1)))
        if k > 1:
            body = body.resize((w * k, h * k), Image.NEAREST)
    note = raster.constant_note(a)
    if note:
        right = raster.message_panel(110, max(body.size[1], 60), "no colour scale: the map is constant")
    else:
        label = "attribution (sum over channels)" if a.shape[0] > 1 else "attribution per token"
        # A token strip is short: the bar is taller than it, so that its label fits.
        right = raster.colorbar(max(body.size[1], 150 if h == 1 else 60), -s if signed else 0.0, s, cmap, label)
    return raster.titled(body, title.split("\n"), right=right, note=note)


def _token_row(strip: Image.Image, tokens: list[str], cell: int) -> Image.Image:
    """``strip`` with each token's text under its cell, turned upright when it is wider."""
    from PIL import Image, ImageDraw

    from inspect_model.render import raster
    from inspect_model.render.token_strips import token_label

    names = [token_label(t) for t in tokens]
    widest = max((raster.text_size(n, 11)[0] for n in names), default=0)
    upright = widest > cell - 4
    below = widest + 6 if upright else 16
    out = Image.new("RGB", (strip.size[0], strip.size[1] + below), (255, 255, 255))
    out.paste(strip, (0, 0))
    draw = ImageDraw.Draw(out)
    for i, name in enumerate(names):
        if upright:
            label = raster.vertical_text(name, 11)
            out.paste(label, (i * cell + (cell - label.size[0]) // 2, strip.size[1] + 3))
        else:
            tw = raster.text_size(name, 11)[0]
            draw.text((i * cell + (cell - tw) // 2, strip.size[1] + 2), name, fill=raster.FG, font=raster.font(11))
    return out


def overlay(image: Image.Image, m: torch.Tensor, box: Sequence[float] | None = None, *,
            signed: bool) -> Image.Image | None:
    """The map blended over the original picture (``render.overlay.overlay``); None for
    maps that are not images."""
    from inspect_model.render.overlay import overlay as blend

    a = reduce_map(m)
    if a.shape[0] == 1 or m.dim() != 3:
        return None
    v, _ = normalised(a, signed)
    # Opacity follows the magnitude: no evidence, no colour (a fixed alpha would wash the
    # whole picture with the colour of 0).
    opacity = (abs(2.0 * v - 1.0) if signed else v) ** 0.5
    return blend(image, v, box, cmap=SIGNED_CMAP if signed else UNSIGNED_CMAP, alpha=0.9, opacity=opacity)


def sheet_cell(m: torch.Tensor, signed: bool) -> Image.Image:
    """A contact-sheet thumbnail of one map (kept instead of the map until the page is drawn)."""
    from PIL import Image

    from inspect_model.render import raster
    from inspect_model.render.overlay import THUMB, thumbnail

    v, _ = normalised(reduce_map(m), signed)
    img = Image.fromarray(raster.colorize(v, SIGNED_CMAP if signed else UNSIGNED_CMAP), "RGB")
    if img.size[1] == 1:  # tokens: a strip
        return img.resize((THUMB, 24), Image.NEAREST)
    return thumbnail(img.resize((THUMB, max(1, round(THUMB * img.size[1] / img.size[0]))), Image.NEAREST))


def sheet_picture(picture: Image.Image) -> Image.Image:
    """The input's thumbnail; small inputs are enlarged, pixels kept."""
    from PIL import Image

    from inspect_model.render.overlay import THUMB, thumbnail

    if max(picture.size) < THUMB:
        k = THUMB // max(picture.size)
        picture = picture.resize((picture.size[0] * k, picture.size[1] * k), Image.NEAREST)
    return thumbnail(picture)


def sheet_tokens(tokens: Sequence[str]) -> Image.Image:
    """The input column of a text row: a strip of as many cells as the maps beside it have,
    each token's text under its cell (upright when wider than the cell; none below 10 px)."""
    from PIL import Image, ImageDraw

    from inspect_model.render import raster
    from inspect_model.render.overlay import THUMB
    from inspect_model.render.token_strips import token_label

    n = max(1, len(tokens))
    cell = THUMB / n
    names = [token_label(t, 10) for t in tokens] if cell >= 10 else []
    widest = max((raster.text_size(t, 10)[0] for t in names), default=0)
    upright = widest > cell - 2
    below = (widest + 4 if upright else 14) if names else 0
    out = Image.new("RGB", (THUMB, 24 + below), raster.BG)
    draw = ImageDraw.Draw(out)
    for i in range(n):  # the cells, as the maps' strips draw them
        x0, x1 = round(i * cell), round((i + 1) * cell) - 1
        draw.rectangle((x0, 0, x1, 23), fill=(236, 236, 236), outline=(200, 200, 200))
    for i, name in enumerate(names):
        mid = (i + 0.5) * cell
        if upright:
            label = raster.vertical_text(name, 10)
            out.paste(label, (round(mid - label.size[0] / 2), 26))
        else:
            draw.text((round(mid - raster.text_size(name, 10)[0] / 2), 25), name, fill=raster.FG, font=raster.font(10))
    return out


def sheet(rows: Sequence[tuple[str, Image.Image | None, Sequence[tuple[Image.Image, str]]]],
          methods: Sequence[str], title: str = "") -> Image.Image:
    """A contact sheet: one row per (image, target), the input then one column per method;
    cells are (thumbnail, caption) from :func:`sheet_cell`."""
    from inspect_model.render.overlay import SheetCell, contact_sheet

    out_rows = []
    for label, picture, cells in rows:
        row: list[SheetCell | None] = [SheetCell(picture, "input") if picture is not None else None]
        row += [SheetCell(thumb, caption) for thumb, caption in cells]
        out_rows.append((label, row))
    return contact_sheet(out_rows, ["input", *methods], title=title)


# ------------------------------------------------------------------------- records
def _num(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    a = abs(v)
    return "0" if a == 0 else (f"{v:.4g}" if 1e-3 <= a < 1e5 else f"{v:.2e}")


MAP_COLUMNS = (Column("Image"), Column("Target"), Column("Method"), Column("Positive", "right"),
               Column("Negative", "right"), Column("Sum", "right"), Column("Gap", "right"))


def caption(rec: dict[str, Any]) -> str:
    """A cell caption: the map's sum, and IG's gap."""
    text = f"sum {_num(rec['sum'])}"
    if rec.get("completeness_gap") is not None:
        text += f" gap {_num(rec['completeness_gap'])}"
    return text


def report_of(payload: Mapping[str, Any] | AttributionsReport) -> AttributionsReport:
    """The report's typed records (a ``--json`` document is read into them)."""
    return payload if isinstance(payload, AttributionsReport) else AttributionsReport.from_dict(payload)


def _given(value: Any) -> Any:
    """An optional field's value, None where it was left out."""
    return None if value is ABSENT else value


def map_rows(payload: Mapping[str, Any] | AttributionsReport) -> list[list[str]]:
    rows = []
    for img in report_of(payload).images:
        for rec in img.maps:
            name = rec.method + (" (smoothed)" if rec.smoothed else "")
            rows.append([img.image, target_label(rec.target), name, _num(rec.positive_mass),
                         _num(rec.negative_mass), _num(rec.sum), _num(_given(rec.completeness_gap))])
    return rows


def sanity_table(sanity: Sanity) -> tuple[list[Column], list[list[str]]]:
    """Per randomisation step, each method's mean Spearman rho with the original maps
    (magnitudes): near 1 means the maps do not depend on those weights."""
    methods = list(sanity.steps[0].methods) if sanity.steps else []
    cols = [Column("Randomised", "right"), Column("Down to")] + [Column(m, "right") for m in methods]
    rows = [[str(st.randomized), st.down_to] + [_num(st.methods[m].spearman_abs_mean) for m in methods]
            for st in sanity.steps]
    return cols, rows


GENERATION_COLUMNS = (Column("Text"), Column("Step", "right"), Column("Token"), Column("log p", "right"),
                      Column("Score", "right"), Column("Method"), Column("Top source"), Column("Sum", "right"),
                      Column("Gap", "right"))


def _tables(rep: AttributionsReport) -> list[tuple[str, list[Column], list[list[str]]]]:
    from inspect_model.render import faithfulness as rf

    if any(i.generation for i in rep.images):  # --generate (issue 36)
        return [("\n".join(generation_lines(rep)), list(GENERATION_COLUMNS), generation_rows(rep))]
    out = [("", list(MAP_COLUMNS), map_rows(rep))]
    ev = rep.evaluation.to_dict() if rep.evaluation else None  # the evaluator's summary (run/evaluate.py)
    if ev is not None and ev.get("average"):
        cols, rows = rf.average_table(ev)
        out.append((f"{rf.header(ev)}\naverage over {rep.image_count} image(s):", cols, rows))
    if rep.sanity:
        cols, rows = sanity_table(rep.sanity)
        out.append(("sanity (Adebayo et al. 2018): mean Spearman rho of |map| with the original, top layers "
                    "randomised", cols, rows))
    return out


def _title(rep: AttributionsReport) -> str:
    where = f"the output of embedding layer '{rep.embedding_layer}'" if rep.embedding_layer else "the input"
    if any(i.generation for i in rep.images):
        return (f"Attributions over a generation: {', '.join(rep.methods)} (to {where}); "
                "each generated token's score attributed to the tokens before it")
    return f"Attributions: {', '.join(rep.methods)} (to {where})"


def render_text(payload: Mapping[str, Any] | AttributionsReport) -> str:
    """Plain text, formatted from the report's typed records."""
    rep = report_of(payload)
    lines = [_title(rep)]
    for title, cols, rows in _tables(rep):
        lines += ([title] if title else []) + [plain_table(cols, rows)]
    sheets = _given(rep.contact_sheets) or []
    if sheets:
        lines.append("contact sheets: " + ", ".join(sheets))
    lines.extend(warning_text(rep))
    return "\n".join(lines)


def render_rich(payload: Mapping[str, Any] | AttributionsReport) -> list[Any]:
    rep = report_of(payload)
    parts: list[Any] = []
    for i, (title, cols, rows) in enumerate(_tables(rep)):
        parts.append(rich_table(cols, rows, title=_title(rep) if i == 0 else title))
    return [*parts, *warning_text(rep)]


def render_result(result: Any, rich: bool) -> Any:
    """The registry's renderer: the report of an ``attributions`` result (text or rich)."""
    rep = report_of(result.to_dict())
    return render_rich(rep) if rich else render_text(rep) + "\n"


def generation_rows(rep: AttributionsReport) -> list[list[str]]:
    """The report's rows: per text, generated token and method, the token's log-probability,
    the score explained, the source token with the largest |attribution|, the row's sum and
    integrated gradients' completeness gap."""
    from inspect_model.render.token_strips import token_label

    rows = []
    for img in rep.images:
        gen = img.generation
        if not gen:
            continue
        for rec in img.maps:
            t = rec.rank
            cells = _given(rec.tokens) or []
            j = max(range(len(cells)), key=lambda k: abs(cells[k]), default=None)
            top = f"{token_label(gen.columns[j].token)} ({_num(cells[j])})" if j is not None else "-"
            tok = gen.tokens[t]
            rows.append([str(img.image), str(t + 1), token_label(tok.token), _num(tok.log_prob), _num(tok.score),
                         rec.method, top, _num(rec.sum), _num(_given(rec.completeness_gap))])
    return rows


def generation_lines(rep: AttributionsReport) -> list[str]:
    """One line per text: the prompt, what followed it, how."""
    from inspect_model.render.table import one_line

    out = []
    for img in rep.images:
        gen = img.generation
        if gen:
            prompt = img.text.text if img.text else ""
            end = ", stopped at the end token" if gen.stopped else ""
            out.append(f"{one_line(img.image)}: {one_line(repr(prompt))} -> {one_line(repr(gen.text))} "
                       f"({gen.mode}, {len(gen.tokens)} token(s){end})")
    return out
