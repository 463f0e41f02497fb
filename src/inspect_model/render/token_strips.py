"""Per-token heat strips as HTML, for report.html (issue 26): a text's tokens coloured by each
map's values, from its report entry alone (the colours are the PNG strips' tables). The
token helpers here are shared with :mod:`inspect_model.render.attention_text`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np


def token_label(t: str, most: int = 12) -> str:
    """A token as drawn: control characters escaped, space marks as _, cut at ``most``."""
    from inspect_model.render.raster import shown

    t = shown(t).replace("\u0120", "_").replace("\u2581", "_")  # GPT-2's and SentencePiece's space marks
    return t if len(t) <= most else t[: most - 1] + "…"


def strip_scale(v: np.ndarray, query: int | None) -> float:
    """A strip's scale: its largest value outside the query token, whose own share in both
    rollouts is the identity's (it would wash out every other token); that token saturates."""
    import numpy as np

    rest = np.delete(v, query) if query is not None and 0 <= query < v.size and v.size > 1 else v
    top = float(np.nanmax(rest)) if rest.size else 0.0
    return top if top > 0 else 1.0


def short_layer(name: str) -> str:
    """A layer's index path (``bert.encoder.layer.1.attention.self`` -> ``1``), else its last part."""
    parts = name.split(".")
    return ".".join(p for p in parts if p.isdigit()) or parts[-1]


def strip_html(entry: dict[str, Any], cmap: str = "viridis") -> str:
    """The per-token heat strips of one text's report entry, as HTML (report.html)."""
    import html

    import numpy as np

    from inspect_model.render import raster

    text = entry.get("text") or {}
    tokens = text.get("tokens") or []
    lut = raster.colormap_lut(cmap)
    from inspect_model.render.table import one_line

    def h(value: Any) -> str:  # control characters from --text escaped, as report.txt shows them (issue 41)
        return html.escape(one_line(value), quote=True)

    head = f'{h(entry.get("image"))}: {h(text.get("text", ""))}'
    out = [f'<div class="strip"><p class="meta">{head}</p>']
    for m in entry.get("maps") or []:
        values = m.get("values")
        if not values or isinstance(values[0], list):
            values = np.mean(np.asarray(values, dtype=np.float64), axis=0).tolist() if values else None
        if not values:
            continue
        v = np.asarray([0.0 if x is None else x for x in values], dtype=np.float64)
        top = strip_scale(v, text.get("query"))
        spans = []
        for i, tok in enumerate(tokens[: len(v)]):
            rgb = lut[raster.levels(np.clip(v[i:i + 1] / top, 0, 1))[0]]
            ink = "#000" if 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] > 140 else "#fff"
            edge = ";outline:2px solid #000" if i == text.get("query") else ""
            spans.append(f'<span title="{v[i]:.4g}" style="background:rgb({rgb[0]},{rgb[1]},{rgb[2]});color:{ink};'
                         f'padding:1px 3px;margin:1px{edge}">{h(token_label(str(tok), 24))}</span>')
        label = m["method"] + ("" if m.get("layer") in (None, "all") else f" {short_layer(m['layer'])}")
        out.append(f'<div><b style="display:inline-block;min-width:120px" title="{h(m.get("layer"))}">'
                   f'{h(label)}</b>'
                   + "".join(spans) + "</div>")
    out.append("</div>")
    return "".join(out)
