"""``patch``'s report, tables and pictures (issue 36): records in, text and figures out.

One heat map per pair and site (``images/NNNN-pair-N/patch_<site>.png``): layers down,
positions (token labels) or heads across, the normalised metric in colour (0 white: no
change from the corrupted run; 1: the clean run's value), each cell's value written in it
when the grid is small enough to read.
"""

from __future__ import annotations

from typing import Any

from inspect_model.output.sink import Drawer, Sink

FIG_DPI = 100
MAX_TEXT_COLUMNS = 24  # report.txt shows a grid in full up to this many columns, else its strongest ones


def _num(v: Any, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def patch_report(result: Any, rich: bool) -> Any:
    rep = result.record  # methods/lm/patch_report.PatchReport
    lines = [f"mode: {rep.mode} ({rep.direction})", f"normalised: {rep.normalisation}",
             f"model: {rep.model_parts}", ""]
    for p in rep.pairs:
        lines.append(f"{p.name}: clean {p.clean!r}" + (f", corrupt {p.corrupt!r}" if p.corrupt is not None else ""))
        if p.subject is not None:
            s = p.subject
            lines.append(f"  subject {s.text!r}: tokens {s.first}..{s.end - 1}, noise std {s.noise_std:.4g} "
                         f"({s.noise}), {s.samples} draws, seed {s.seed}")
        lines.append(f"  metric {p.metric.text} at position {p.metric.position}: clean {p.clean_value:.6g}, "
                     f"corrupt {p.corrupt_value:.6g}; {p.cells} patched runs in {p.forwards} forward passes")
        for site in p.sites:
            lines += _site_lines(site)
        lines.append("")
    text = "\n".join(lines).rstrip() + "\n"
    return [text] if rich else text


def _site_lines(site: Any) -> list[str]:
    from inspect_model.render.table import Column, plain_table

    top = site.top
    head = f"  {site.site} ({site.hook}{', window ' + str(site.window) if site.window > 1 else ''}): "
    head += (f"top layer {top.layer}, {site.axis} {top.label}: normalised {_num(top.normalised)} "
             f"(raw {top.raw:.6g})" if top is not None else "no effect (clean and corrupt agree)")
    cols = list(range(len(site.labels)))
    if len(cols) > MAX_TEXT_COLUMNS:  # the columns with the largest effect, in order
        score = {i: max(abs(row[i] or 0.0) for row in site.normalised) for i in cols}
        cols = sorted(sorted(cols, key=lambda i: -score[i])[:MAX_TEXT_COLUMNS])
    columns = [Column("layer", "right")] + [Column(site.labels[i], "right") for i in cols]
    rows = [[str(layer)] + [_num(row[i], 2) for i in cols] for layer, row in enumerate(site.normalised)]
    return [head] + ["    " + line for line in plain_table(columns, rows).splitlines()]


def patch_tables(doc: dict[str, Any]) -> list[Any]:
    """report.html: one row per pair and site (its strongest cell)."""
    rows = []
    for p in doc.get("pairs") or []:
        for s in p.get("sites") or []:
            top = s.get("top") or {}
            rows.append({"pair": p.get("name"), "clean": p.get("clean"), "corrupt": p.get("corrupt"),
                         "metric": (p.get("metric") or {}).get("text"), "clean_value": p.get("clean_value"),
                         "corrupt_value": p.get("corrupt_value"), "site": s.get("site"), "hook": s.get("hook"),
                         "top_layer": top.get("layer"), "top_cell": top.get("label"),
                         "top_normalised": top.get("normalised"), "top_raw": top.get("raw")})
    cols = [(h, (lambda k: lambda r: r.get(k))(k)) for h, k in (
        ("Pair", "pair"), ("Site", "site"), ("Top layer", "top_layer"), ("Top cell", "top_cell"),
        ("Normalised", "top_normalised"), ("Raw", "top_raw"), ("Clean", "clean_value"),
        ("Corrupt", "corrupt_value"), ("Metric", "metric"), ("Clean prompt", "clean"),
        ("Corrupt prompt", "corrupt"))]
    return [("Patching (one row per pair and site: the cell that moves the metric most)", rows, cols)]


def site_figure(pair: Any, site: Any, mode: str, colormap: str) -> Any:
    """The heat map of one site's normalised grid (module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

    grid = [[float("nan") if v is None else v for v in row] for row in site.normalised]
    layers, width = len(grid), len(grid[0]) if grid else 0
    fig = Figure(figsize=(min(16.0, max(6.5, 2.5 + 0.55 * width)), min(12.0, 2.6 + 0.4 * layers)), dpi=FIG_DPI)
    ax = fig.subplots()
    finite = [v for row in grid for v in row if v == v]
    hi = max([1.0, *(abs(v) for v in finite)])  # one scale for both signs: 0 is white, 1 the clean run
    im = ax.imshow(grid, cmap=colormap, norm=Normalize(vmin=-hi, vmax=hi), aspect="auto", interpolation="nearest")
    ax.set_yticks(range(layers), [str(i) for i in range(layers)], fontsize=8)
    ax.set_ylabel("layer")
    ax.set_xticks(range(width), list(site.labels), rotation=60 if site.axis == "position" else 0, ha="right"
                  if site.axis == "position" else "center", fontsize=8)
    ax.set_xlabel("position (token)" if site.axis == "position" else "head")
    if layers * width <= 400:
        for layer, row in enumerate(grid):
            for i, v in enumerate(row):
                if v == v:
                    ax.text(i, layer, f"{v:.2f}", ha="center", va="center", fontsize=6,
                            color="white" if abs(v) > 0.6 * hi else "black")
    what = {"resid": "residual stream (block output)", "attn": "attention output", "mlp": "MLP output",
            "head": "attention head output (input of the output projection)"}[site.site]
    verb = {"denoise": "clean -> corrupted run", "noise": "corrupted -> clean run",
            "trace": "clean state restored into noised run"}[mode]
    window = f", window {site.window}" if site.window > 1 else ""
    ax.set_title(f"{pair.name}: {what}\n{verb}{window}; metric {pair.metric.text}: clean {pair.clean_value:.4g}, "
                 f"corrupt {pair.corrupt_value:.4g}", fontsize=9)
    bar = fig.colorbar(im, ax=ax)
    bar.set_label("normalised metric (clean 1, corrupt 0)", fontsize=8)
    fig.tight_layout()
    return fig


class PatchDrawer(Drawer):
    """One heat map per pair and site."""

    def __init__(self, colormap: str, mode: str) -> None:
        self.colormap, self.mode = colormap, mode

    def draw(self, item: Any, sink: Sink) -> dict[str, Any]:
        from inspect_model.output.files import image_dir

        pair = item.data
        if pair is None or not sink.active:
            return {}
        folder = image_dir(pair.index, pair.name)
        out = {}
        for site in pair.sites:
            name = sink.figure(f"{folder}/patch_{site.site}.png", site_figure(pair, site, self.mode, self.colormap),
                               dpi=FIG_DPI)
            if name is not None:
                out[site.site] = name
        return out
