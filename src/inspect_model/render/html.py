"""``report.html``: one self-contained static page per output directory.

Built from the ``--json`` document alone (a dict in, a str out): the report table (click a
column header to sort), every picture the run wrote with a caption, and the warnings. No
server, no network: styles and the sorting script are inline, pictures are relative links
loaded lazily (``loading="lazy"``), so a page over 10,000 images opens at once. The page
is deterministic (no dates), like every other file of a run.
"""

from __future__ import annotations

import html
import math
from pathlib import PurePosixPath
from typing import Any
from inspect_model.render.labels import target_label

MAX_ROWS = 20000  # table rows shown; the JSON report has them all

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"DejaVu Sans",sans-serif;margin:0 24px 40px;color:#222}
h1{font-size:20px;margin:18px 0 4px}h2{font-size:16px;margin:24px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:14px;margin:14px 0 6px}.meta{color:#666}
table{border-collapse:collapse;font-size:12px}th,td{padding:3px 8px;border-bottom:1px solid #eee;
text-align:left;white-space:nowrap}td.n{text-align:right;font-variant-numeric:tabular-nums}
th{position:sticky;top:0;background:#f4f4f4;cursor:pointer;user-select:none}
th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
.scroll{max-height:70vh;overflow:auto;border:1px solid #ddd;display:inline-block;max-width:100%}
.pics{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}figure{margin:0;max-width:380px}
.pair{display:flex;flex-wrap:nowrap;gap:6px;align-items:flex-start;padding:4px;border:1px solid #eee}
.pair figure{max-width:300px}
.wide figure{max-width:100%}figure img{max-width:100%;min-width:120px;height:auto;border:1px solid #ddd;
display:block;image-rendering:pixelated}figcaption{font-size:12px;color:#444;word-break:break-all}
ul.warn li{color:#8a4b00}.fail{color:#b00020;font-weight:bold}
table.sortable .x{display:none}table.sortable.all .x{display:table-cell}
button.cols{font:inherit;font-size:12px;margin-right:8px}
"""

_SCRIPT = """
document.querySelectorAll("button.cols").forEach(function (b) {
  var t = b.parentNode.nextElementSibling.querySelector("table");
  b.addEventListener("click", function () {
    var all = t.classList.toggle("all");
    b.setAttribute("aria-pressed", all ? "true" : "false");
  });
});
document.querySelectorAll("table.sortable").forEach(function (t) {
  var heads = t.tHead.rows[0].cells;
  Array.prototype.forEach.call(heads, function (th, col) {
    th.addEventListener("click", function () {
      var asc = th.getAttribute("aria-sort") !== "ascending";
      Array.prototype.forEach.call(heads, function (h) { h.removeAttribute("aria-sort"); });
      th.setAttribute("aria-sort", asc ? "ascending" : "descending");
      var body = t.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      function key(r) {
        var c = r.cells[col], v = c ? (c.getAttribute("data-v") || c.textContent) : "";
        var f = parseFloat(v);
        return isNaN(f) || !/^\\s*[-+]?[0-9.]/.test(v) ? [1, v.toLowerCase()] : [0, f];
      }
      rows.sort(function (a, b) {
        var x = key(a), y = key(b), d = x[0] - y[0];
        if (!d) { d = x[1] < y[1] ? -1 : x[1] > y[1] ? 1 : 0; }
        return asc ? d : -d;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
"""


def _esc(v: Any) -> str:
    """Text for the page: names keep their characters, but control characters and bytes
    that are not UTF-8 are escaped as report.txt shows them (a lone surrogate cannot be
    written as UTF-8, issue 28); report.json keeps them exact."""
    from inspect_model.render.table import one_line

    return html.escape(one_line(v), quote=True)


def _cell(v: Any) -> tuple[str, bool]:
    """(text, numeric) of one table value."""
    if v is None:
        return "", False
    if isinstance(v, bool):
        return ("yes" if v else "no"), False
    if isinstance(v, int):
        return str(v), True
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v), False
        return (f"{v:.4g}" if v == 0 or 1e-3 <= abs(v) < 1e5 else f"{v:.3e}"), True
    if isinstance(v, (list, tuple)):
        return "x".join(str(x) for x in v) if all(isinstance(x, int) for x in v) else ", ".join(map(str, v)), False
    return str(v), False


def _flatten(d: dict[str, Any], prefix: str = "", depth: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if k in ("files", "warnings", "channel_means", "sample_norms", "layer_grad_norms", "predictions"):
            continue
        name = f"{prefix}{k}"
        if isinstance(v, dict) and depth < 1:
            out.update(_flatten(v, f"{name}.", depth + 1))
        elif isinstance(v, (str, int, float, bool)) or v is None or (
                isinstance(v, (list, tuple)) and len(v) <= 6 and all(isinstance(x, (int, str)) for x in v)):
            out[name] = v
    return out


def table_rows(doc: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The report table of a document: (title, flat rows). Per-map rows for cam and
    guided-backprop, per-layer rows where the document has layers, else per-image rows."""
    images = doc.get("images") or []
    if images and all(isinstance(i, dict) and i.get("maps") for i in images):
        rows = [{"image": i.get("image"), **_flatten(m)} for i in images for m in i["maps"]]
        return "Maps (one row per image, target, method and layer)", rows
    for key, title in (("layers", "Layers"), ("checks", "Checks"), ("params", "Parameters"),
                       ("jacobians", "Jacobians"), ("images", "Images"), ("models", "Models")):
        items = doc.get(key)
        if isinstance(items, list) and items and isinstance(items[0], dict):
            return title, [_flatten(i) for i in items]
    return "Report", []


def _td(raw: Any, extra: bool) -> str:
    text, numeric = _cell(raw)
    cls = " ".join(c for c in ("n" if numeric else "", "x" if extra else "") if c)
    attr = f' class="{cls}"' if cls else ""
    data = f' data-v="{raw!r}"' if numeric and isinstance(raw, float) else ""
    return f"<td{attr}{data}>{_esc(text)}</td>"


def _table(records: list[dict[str, Any]], columns: Any) -> str:
    """The columns report.txt shows (``columns``: header, getter), in its order; every other
    value of the records after them, hidden until "all columns" is pressed (issue 29)."""
    rows = [_flatten(r) for r in records[:MAX_ROWS]]
    shown = {getattr(get, "reads", None) for _, get in columns}
    extra: list[str] = []
    for r in rows[:200]:
        for k in r:
            if k not in shown and k not in extra:
                extra.append(k)
    out = []
    if extra:
        out.append(f'<p class="meta"><button type="button" class="cols" aria-pressed="false">all columns '
                   f"(+{len(extra)})</button> click a column header to sort</p>")
    else:
        out.append('<p class="meta">click a column header to sort</p>')
    out.append('<div class="scroll"><table class="sortable"><thead><tr>')
    out += [f"<th>{_esc(h)}</th>" for h, _ in columns]
    out += [f'<th class="x">{_esc(k)}</th>' for k in extra]
    out.append("</tr></thead><tbody>")
    for rec, flat in zip(records, rows):
        out.append("<tr>" + "".join(_td(get(rec), False) for _, get in columns)
                   + "".join(_td(flat.get(k), True) for k in extra) + "</tr>")
    out.append("</tbody></table></div>")
    if len(records) > MAX_ROWS:
        out.append(f'<p class="meta">first {MAX_ROWS} of {len(records)} rows; report.json has them all</p>')
    return "".join(out)


def _figure(p: str, captions: dict[str, str]) -> str:
    cap = captions.get(p) or PurePosixPath(p).name
    return (f'<figure><a href="{_esc(p)}"><img loading="lazy" decoding="async" src="{_esc(p)}" '
            f'alt="{_esc(cap)}"></a><figcaption>{_esc(cap)}</figcaption></figure>')


def _figures(paths: list[str], captions: dict[str, str], wide: bool = False,
             groups: list[list[str]] | None = None) -> str:
    """The pictures; those of one map (its overlay and heat map) side by side, in the order
    the report lists the maps (issue 39), the rest after them by name."""
    out = ['<div class="pics wide">' if wide else '<div class="pics">']
    have = set(paths)
    placed: set[str] = set()
    for g in groups or []:
        members = [p for p in g if p in have and p not in placed]
        if not members:
            continue
        placed.update(members)
        figs = "".join(_figure(p, captions) for p in members)
        out.append(f'<div class="pair">{figs}</div>' if len(members) > 1 else figs)
    out += [_figure(p, captions) for p in paths if p not in placed]
    out.append("</div>")
    return "".join(out)


_KIND_ORDER = {"overlay": 0, "heatmap": 1, "strip": 2}


def _map_groups(doc: dict[str, Any]) -> list[list[str]]:
    """Each map's pictures (overlay, heat map...) as one group, in the report's order of
    images and maps (the order the methods were asked for, not file names)."""
    groups: list[list[str]] = []
    for img in doc.get("images") or []:
        if not isinstance(img, dict):
            continue
        for m in img.get("maps") or []:
            files = m.get("files") if isinstance(m, dict) else None
            if isinstance(files, dict):  # the overlay first, then the heat map (report.json sorts its keys)
                kinds = sorted(files, key=lambda k: (_KIND_ORDER.get(k, len(_KIND_ORDER)), k))
                groups.append([files[k] for k in kinds if isinstance(files[k], str)
                               and files[k].lower().endswith(".png")])
    return groups


def _captions(doc: dict[str, Any]) -> dict[str, str]:
    """What each picture shows, from the document where it says so."""
    caps: dict[str, str] = {}
    for img in doc.get("images") or []:
        if not isinstance(img, dict):
            continue
        for m in img.get("maps") or []:
            t = m.get("target") or {}
            label = target_label(t, prefix="class ")
            what = f"{m['method']} @ {m['layer']}" if m.get("method") else "guided backprop"
            for kind, path in (m.get("files") or {}).items():
                if isinstance(path, str) and path.endswith(".png"):
                    caps[path] = f"{img.get('image')}: {what}, {label} ({kind})"
        for kind, path in (img.get("files") or {}).items():
            if isinstance(path, str) and path.endswith(".png"):
                caps.setdefault(path, f"{img.get('image')}: {kind}")
    for g in doc.get("grids") or []:
        if isinstance(g, dict) and g.get("file"):
            caps[g["file"]] = f"{g.get('image')}: layer {g.get('layer')} ({g.get('kind')}, " \
                              f"{len(g.get('channels') or [])} of {g.get('total_channels')} channels)"
    fixed = {"overview.png": "statistics along the depth of the network", "grad_flow.png": "gradient flow per layer",
             "graph.svg": "the model's graph (modules, operations between them, inputs and outputs)"}
    for p in doc.get("files") or []:
        name = PurePosixPath(p).name
        if p in fixed:
            caps.setdefault(p, f"{p}: {fixed[p]}")
        elif name.startswith("contact_sheet_"):
            caps.setdefault(p, f"{p}: contact sheet (rows: image and target; columns: method and layer)")
        elif name.startswith("grad_histograms_"):
            caps.setdefault(p, f"{p}: histograms of log10 |gradient| per layer")
    return caps


def render_html(doc: dict[str, Any]) -> str:
    """The page for one ``--json`` document (its ``files`` are the pictures)."""
    command = doc.get("command", "")
    model = doc.get("model") or (doc.get("options") or {}).get("model") or ""
    files = [f for f in doc.get("files") or [] if f.lower().endswith((".png", ".jpg", ".jpeg"))]
    if "graph.svg" in (doc.get("files") or []):  # summary --graph: the scalable picture, once
        files = ["graph.svg" if f == "graph.png" else f for f in files]
    top = [f for f in files if "/" not in f]
    nested: dict[str, list[str]] = {}
    for f in files:
        if "/" in f:
            nested.setdefault(str(PurePosixPath(f).parent), []).append(f)
    caps = _captions(doc)
    count = doc.get("image_count")
    meta = [f"{command}", f"model {model}" if model else "", f"{count} image(s)" if count is not None else "",
            f"inspect-model {doc.get('tool_version', '')}", f"torch {doc.get('torch_version', '')}"
            if doc.get("torch_version") else ""]
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{_esc(command)}: {_esc(model)}</title><style>{_CSS}</style></head><body>",
             f"<h1>inspect-model {_esc(command)}</h1>",
             f'<p class="meta">{_esc(" · ".join(m for m in meta if m))}</p>']
    warnings = doc.get("warnings") or []
    parts.append(f"<h2>Warnings ({len(warnings)})</h2>")
    if warnings:
        parts.append('<ul class="warn">' + "".join(
            f"<li>{_esc(w.get('message'))}" + (f" (x{w['count']})" if w.get("count", 1) > 1 else "") + "</li>"
            for w in warnings) + "</ul>")
    else:
        parts.append('<p class="meta">none</p>')
    failed = [c for c in doc.get("checks") or [] if isinstance(c, dict) and c.get("status") == "fail"]
    if failed:
        parts.append('<p class="fail">failed checks: ' + _esc(", ".join(str(c.get("name")) for c in failed))
                     + "</p>")
    from inspect_model.render.html_columns import headline, tables

    parts += [f'<p class="meta">{_esc(line)}</p>' for line in headline(doc)]
    for title, records, columns in tables(doc):
        parts.append(f"<h2>{_esc(title)} ({len(records)})</h2>")
        parts.append(_table(records, columns))
    from inspect_model.render.lens import lens_html

    parts += lens_html(doc)  # lens: per text a layers x positions grid of decoded tokens (nothing for others)
    from inspect_model.render.generation import generation_section

    parts += generation_section(doc)  # attributions --generate: per generated token a strip (nothing for others)
    texts = [i for i in doc.get("images") or [] if isinstance(i, dict) and i.get("text") and i.get("maps")
             and not i.get("generation")]
    if texts:  # attention --text: per-token heat strips (render/token_strips.py)
        from inspect_model.render.token_strips import strip_html

        parts.append(f"<h2>Tokens ({len(texts)} text(s); each row scaled to its largest value outside the outlined query token)</h2>")
        parts += [strip_html(i) for i in texts[:MAX_ROWS // 20]]
    if top:
        parts.append("<h2>Pictures of the whole run</h2>")
        parts.append(_figures(top, caps, wide=True))
    if nested:
        groups = _map_groups(doc)
        parts.append(f"<h2>Pictures per image ({len(nested)})</h2>")
        for folder, paths in nested.items():
            parts.append(f"<h3>{_esc(folder)}</h3>")
            parts.append(_figures(paths, caps, groups=groups))
    parts.append('<p class="meta">Files: ' + _esc(", ".join(doc.get("files") or [])[:2000]) + "</p>")
    parts.append(f"<script>{_SCRIPT}</script></body></html>")
    return "\n".join(parts) + "\n"
