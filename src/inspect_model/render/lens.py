"""The reports of ``lens`` (issue 36): ``report.txt`` (the readout used, the per-depth means,
and per text the top token of every layer at every position, the classic logit-lens table)
and report.html's parts (the per-depth table; per text a layers x positions grid whose cells
show the decoded top token, coloured by the probability of the model's own prediction, the
top-k in each cell's tooltip).

Renderers read the report record's ``to_dict()`` form (a dict), never the method's objects.
"""

from __future__ import annotations

import html
from typing import Any

MAX_TEXTS = 5  # texts shown in report.txt (the JSON has them all)
MAX_COLUMNS = 12  # positions per text in report.txt: the last ones
CELL = 10  # characters of a token in report.txt


def show_token(t: str, width: int = CELL) -> str:
    """A token made visible: spaces as '·', newlines as '⏎', cut to ``width``."""
    s = t.replace(" ", "·").replace("\n", "⏎").replace("\t", "⇥") or "∅"
    return s if len(s) <= width else s[: width - 1] + "…"


def _depth_rows(layers: list[dict[str, Any]]) -> list[list[str]]:
    return [[r["site"], str(r["depth"]), r["layer"], f"{r['kl']:.4f}", f"{r['prob']:.4f}", f"{100 * r['top1']:.1f}%",
             f"{r['entropy']:.3f}"] for r in layers]


def _grid(text: dict[str, Any], site: str) -> str:
    from inspect_model.render.table import Column, plain_table

    n = len(text["tokens"])
    cols = list(range(max(0, n - MAX_COLUMNS), n))
    rows = [r for r in text["rows"] if r["site"] == site]
    body = [[f"{r['depth']} {r['layer']}"] + [show_token(r["top"][c][0]["token"]) if r["top"][c] else "" for c in cols]
            for r in rows]
    body.append(["model predicts"] + [show_token(text["predicted"][c]) for c in cols])
    head = [Column(f"{site} \\ input")] + [Column(show_token(text["tokens"][c])) for c in cols]
    cut = f" (last {len(cols)} of {n} positions)" if len(cols) < n else ""
    return f"{text['image']}: {text['text']!r}{cut}; cells: the top decoded token at each layer\n" \
        + plain_table(head, body)


def lens_text(doc: dict[str, Any]) -> str:
    """report.txt from the report body (``LensReport.to_dict()`` plus the envelope)."""
    from inspect_model.render.table import Column, plain_table

    a = doc["anatomy"]
    err = doc.get("readout_error")
    kind = "tuned lens " + str(doc.get("lens_file")) if doc["lens"] == "tuned" else "logit lens"
    lines = [f"{kind}; readout: {a['description']}",
             "check: the last block's readout vs the model's logits, max |diff| = "
             + ("-" if err is None else f"{err:.3g}"), ""]
    texts = doc.get("images") or []
    positions = sum(len(t["tokens"]) for t in texts)
    lines.append(f"Per depth, mean over {positions} position(s) of {len(texts)} text(s): KL(model || lens) in nats, "
                 "p(pred) = probability of the model's prediction, top-1 = pred: how often it is the top token")
    lines.append(plain_table([Column("Site"), Column("Depth", "right"), Column("Layer"), Column("KL", "right"),
                              Column("p(pred)", "right"), Column("top-1 = pred", "right"),
                              Column("Entropy", "right")], _depth_rows(doc.get("layers") or [])))
    for t in texts[:MAX_TEXTS]:
        for site in doc["sites"]:
            lines += ["", _grid(t, site)]
    if len(texts) > MAX_TEXTS:
        lines += ["", f"... {len(texts) - MAX_TEXTS} more text(s) in report.json"]
    return "\n".join(lines) + "\n"


def lens_report(r: Any, rich: bool) -> Any:
    text = lens_text(r.to_dict())
    return [text] if rich else text


def lens_tables(doc: dict[str, Any]) -> list[Any]:
    from inspect_model.render.html_columns import at, pct

    cols = [("site", at("site")), ("depth", at("depth")), ("layer", at("layer")), ("KL (nats)", at("kl")),
            ("p(pred) %", pct("prob")), ("top-1 = pred %", pct("top1")), ("entropy", at("entropy")),
            ("positions", at("positions"))]
    return [("Per depth (mean over every position of every text)", doc.get("layers") or [], cols)]


def _colour(p: float) -> str:
    """White (0) to a saturated blue (1); text stays readable (dark on light, light on dark)."""
    p = min(max(p, 0.0), 1.0)
    r, g, b = (int(255 - (255 - c) * p) for c in (33, 102, 172))
    fg = "#fff" if p > 0.55 else "#111"
    return f"background:rgb({r},{g},{b});color:{fg}"


def _cell(row: dict[str, Any], c: int) -> str:
    top = row["top"][c]
    tip = "; ".join(f"{t['token']!r} {100 * t['prob']:.1f}%" for t in top)
    tip = f"p(pred) {100 * row['prob'][c]:.1f}%, rank {row['rank'][c]}, KL {row['kl'][c]:.3f}; top: {tip}"
    label = show_token(top[0]["token"], 14) if top else ""
    return f'<td style="{_colour(row["prob"][c])}" title="{html.escape(tip)}">{html.escape(label)}</td>'


def lens_html(doc: dict[str, Any], max_texts: int = 50) -> list[str]:
    """report.html's grids, one per text and site (module docstring); [] for other documents."""
    texts = [t for t in doc.get("images") or [] if isinstance(t, dict) and isinstance(t.get("rows"), list)]
    if not texts or doc.get("command") is None:
        return []
    out = ["<h2>Lens grids: per text and site, the top decoded token at each layer (rows) and position "
           "(columns: the input token); colour: probability of the model's own prediction there (white 0, blue 1); "
           "hover a cell for its top tokens</h2>"]
    for t in texts[:max_texts]:
        for site in sorted({r["site"] for r in t["rows"]}, key=["resid", "attn", "mlp"].index):
            rows = [r for r in t["rows"] if r["site"] == site]
            head = "".join(f"<th>{html.escape(show_token(tok, 14))}</th>" for tok in t["tokens"])
            body = "".join(f"<tr><th>{r['depth']} {html.escape(r['layer'])}</th>"
                           + "".join(_cell(r, c) for c in range(len(t["tokens"]))) + "</tr>" for r in rows)
            pred = "".join(f"<td><b>{html.escape(show_token(p, 14))}</b></td>" for p in t["predicted"])
            out.append(f"<h3>{html.escape(t['image'])} ({site}): {html.escape(repr(t['text']))}</h3>"
                       f'<div class="scroll"><table><thead><tr><th>layer \\ input</th>{head}</tr></thead>'
                       f"<tbody>{body}<tr><th>model predicts</th>{pred}</tr></tbody></table></div>")
    if len(texts) > max_texts:
        out.append(f'<p class="meta">{len(texts) - max_texts} more text(s) in report.json</p>')
    return out
