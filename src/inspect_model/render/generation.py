"""Pictures of an attribution over a generation (issue 36): the tokens x tokens matrix with
the tokens written on both axes (rows: the generated tokens; columns: the prompt and the
tokens generated before; cells past a row's own prefix left grey), and per-token strips
for report.html (each generated token's row over the text it was predicted from).
Records in (a report entry's ``generation``), a matplotlib figure or HTML out.
"""

from __future__ import annotations

import html
import math
from typing import Any

SIGNED_CMAP = "RdBu_r"  # as render/attributions.py: red raises the score, blue lowers it
UNSIGNED_CMAP = "inferno"


def _scale(values: list[float], percentile: float = 99.5) -> float:
    import numpy as np

    a = np.abs(np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64))
    if a.size == 0:
        return 1.0
    s = float(np.percentile(a, percentile))
    return s if s > 0 else (float(a.max()) or 1.0)


def matrix_figure(gen: dict[str, Any], method: str, *, signed: bool, title: str) -> Any:
    """The matrix of ``method`` from an entry's ``generation`` record, as a figure."""
    import matplotlib

    matplotlib.use("Agg")
    import numpy as np
    from matplotlib.figure import Figure

    from inspect_model.render.token_strips import token_label

    rows = gen["matrices"][method]
    a = np.asarray([[np.nan if v is None else v for v in r] for r in rows], dtype=np.float64).reshape(len(rows), -1)
    n, c = a.shape
    cols = [token_label(col["token"], 14) for col in gen["columns"]]
    labels = [f"{t + 1}: {token_label(tok['token'], 14)}" for t, tok in enumerate(gen["tokens"])]
    fig = Figure(figsize=(max(5.0, 0.3 * c + 3.2), max(3.2, 0.3 * n + 2.4)), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    s = _scale(a.reshape(-1).tolist())
    cmap = matplotlib.colormaps[SIGNED_CMAP if signed else UNSIGNED_CMAP].copy()
    cmap.set_bad("#c4c4c4")  # past the row's prefix: not an input of that step
    im = ax.imshow(np.ma.masked_invalid(a), cmap=cmap, vmin=-s if signed else 0.0, vmax=s, aspect="auto",
                   interpolation="nearest")
    ax.set_xticks(range(c))
    ax.set_xticklabels(cols, rotation=90, fontsize=8)
    ax.set_yticks(range(n))
    ax.set_yticklabels(labels, fontsize=8)
    prompt = sum(1 for col in gen["columns"] if col["part"] == "prompt")
    if 0 < prompt < c:  # where the prompt ends and the generated tokens begin
        ax.axvline(prompt - 0.5, color="#222", lw=1.2)
    ax.set_xlabel("attributed to: prompt | tokens generated before", fontsize=9)
    ax.set_ylabel("generated token (step: token)", fontsize=9)
    ax.set_title(title, fontsize=9)
    bar = fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02)
    bar.set_label("attribution per token (sum over the embedding)", fontsize=8)
    fig.tight_layout()
    return fig


def generation_html(entry: dict[str, Any], signed: dict[str, bool]) -> str:
    """Per method, one strip per generated token: the tokens it was predicted from, coloured
    by their attribution (each row scaled to its largest magnitude), then the token itself."""
    import numpy as np

    from inspect_model.render import raster
    from inspect_model.render.table import one_line
    from inspect_model.render.token_strips import token_label

    def h(value: Any) -> str:
        return html.escape(one_line(value), quote=True)

    gen = entry["generation"]
    cols, toks = gen["columns"], gen["tokens"]
    prompt = (entry.get("text") or {}).get("text", "")
    out = [f'<div class="strip"><p class="meta">{h(entry.get("image"))}: {h(prompt)} → <b>{h(gen["text"])}</b> '
           f'({h(gen["mode"])})</p>']
    for method, rows in gen["matrices"].items():
        is_signed = signed.get(method, True)
        lut = raster.colormap_lut(SIGNED_CMAP if is_signed else UNSIGNED_CMAP)
        out.append(f"<p><b>{h(method)}</b></p>")
        for t, row in enumerate(rows):
            vals = [v for v in row if v is not None]
            top = max((abs(v) for v in vals), default=0.0) or 1.0
            spans = []
            for j, v in enumerate(vals):
                x = (v / top + 1) / 2 if is_signed else max(v, 0.0) / top
                rgb = lut[raster.levels(np.clip(np.asarray([x]), 0, 1))[0]]
                ink = "#000" if 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] > 140 else "#fff"
                spans.append(f'<span title="{v:.4g}" style="background:rgb({rgb[0]},{rgb[1]},{rgb[2]});color:{ink};'
                             f'padding:1px 3px;margin:1px">{h(token_label(str(cols[j]["token"]), 24))}</span>')
            tok = toks[t]
            out.append(f'<div><b style="display:inline-block;min-width:60px">{t + 1}</b>{"".join(spans)}'
                       f'<span style="outline:2px solid #000;padding:1px 3px;margin:1px 6px" title="log p '
                       f'{tok["log_prob"]:.4g}">{h(token_label(str(tok["token"]), 24))}</span></div>')
    out.append("</div>")
    return "".join(out)


def generation_section(doc: dict[str, Any], most: int = 100) -> list[str]:
    """report.html's part for ``attributions --generate``: every text's strips (at most ``most``
    texts; the JSON report has them all); nothing for other documents."""
    gens = [i for i in doc.get("images") or [] if isinstance(i, dict) and i.get("generation")]
    if not gens:
        return []
    signed = {m["method"]: bool(m.get("signed", True)) for i in gens for m in i.get("maps") or []}
    head = (f"<h2>Generation ({len(gens)} text(s); each row scaled to its largest magnitude, the generated token "
            "outlined at its end)</h2>")
    return [head, *(generation_html(i, signed) for i in gens[:most])]
