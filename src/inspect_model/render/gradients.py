"""Rendering ``grads`` results: text/rich tables, gradient-flow and histogram figures, and the
Jacobian map (the JSON entries are methods/gradients/entries.py's records). Pure functions:
records in, str/figure out.

Figures are built on ``matplotlib.figure.Figure`` (Agg, no pyplot state) with a fixed size
and DPI; the caller saves them with ``Sink.figure`` (no timestamp metadata).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from inspect_model.render.table import Column, one_line, plain_table, rich_table

if TYPE_CHECKING:
    from inspect_model.methods.gradients.flow import GradReport, LayerGrad
    from inspect_model.methods.gradients.jacobian import JacobianResult

FIG_DPI = 100


def fmt(v: float | None, spec: str = ".3g") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and math.isnan(v):
        return "nan"
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return format(v, spec)


def pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _max_abs(s: Any) -> float | None:
    """max |g| as reported: NaN for a tensor holding NaN, Inf for one holding Inf."""
    return None if s is None else s.reported_abs_max


def _rep(s: Any) -> Any:
    """The statistics a report shows: NaN/Inf for a tensor holding them (TensorStats.reported)."""
    return None if s is None else s.reported()


# ----------------------------------------------------------------- tables
LAYER_COLUMNS = [
    Column("layer"), Column("type"), Column("output shape"),
    Column("|grad wrt output|", "right"), Column("mean |g| out", "right"), Column("max |g| out", "right"),
    Column("rel. norm", "right"), Column("|grad wrt input|", "right"), Column("non-finite", "right"),
]
PARAM_COLUMNS = [
    Column("parameter"), Column("shape"), Column("grad norm", "right"), Column("mean", "right"),
    Column("std", "right"), Column("max |g|", "right"), Column("zeros", "right"), Column("neg", "right"),
    Column("grad/weight", "right"),
]
CHECK_COLUMNS = [Column("check"), Column("status"), Column("value", "right"), Column("threshold", "right"),
                 Column("detail")]


def _nonfinite(r: LayerGrad) -> str:
    n = sum(s.nan_count + s.inf_count for s in (r.grad_output, r.grad_input) if s is not None)
    return str(n)


def layer_rows(rep: GradReport) -> list[list[str]]:
    rows = []
    for r in rep.layers:
        o, i = _rep(r.grad_output), _rep(r.grad_input)
        rows.append([
            r.key, r.module_type, "x".join(map(str, r.output_shape)) if r.output_shape else "-",
            fmt(o.norm) if o else "not reached", fmt(o.abs_mean) if o else "-", fmt(_max_abs(r.grad_output)),
            fmt(r.relative_norm), fmt(i.norm) if i else "-", _nonfinite(r),
        ])
    return rows


def param_rows(rep: GradReport) -> list[list[str]]:
    rows = []
    for p in rep.params:
        shape = "x".join(map(str, p.shape)) or "scalar"
        if not p.has_grad:
            rows.append([p.name, shape, "no grad", "-", "-", "-", "-", "-", "-"])
            continue
        rows.append([p.name, shape, fmt(p.norm), fmt(p.mean), fmt(p.std), fmt(p.max_abs),
                     pct(p.zero_fraction), pct(p.negative_fraction), fmt(p.ratio)])
    return rows


def check_rows(rep: GradReport) -> list[list[str]]:
    return [[c.name + (" (fail-on)" if c.fail_on else ""), c.status.upper(), fmt(c.value), fmt(c.threshold),
             c.detail] for c in rep.checks]


def header_lines(rep: GradReport) -> list[str]:
    lines = [
        f"Gradients of: {rep.objective}",
        (f"Inputs: {rep.images}    global parameter gradient norm: {fmt(rep.global_norm, '.6g')}    "
         f"output gradient norm: {fmt(rep.output_grad_norm, '.6g')}"),
    ]
    if rep.input_grad is not None:
        lines.append(f"Gradient wrt the model input (saliency): norm {fmt(rep.input_grad.reported().norm, '.6g')}, "
                     f"max |g| {fmt(_max_abs(rep.input_grad))}")
    if rep.clip is not None:
        c = rep.clip
        what = (f"would scale every gradient by {c.scale:.4g}" if c.clipped
                else "would leave the gradients unchanged")
        dom = ", ".join(f"{n} {100 * s:.1f}%" for n, s in c.dominant[:3])
        lines.append(f"clip_grad_norm_(max_norm={c.max_norm:g}): total norm {c.total_norm:.6g}, {what}; "
                     f"largest shares of the squared norm: {dom or '-'}")
    if rep.first_nonfinite:
        lines.append(f"First non-finite gradient in backward order: {rep.first_nonfinite}")
    if rep.frozen_params:
        lines.append(f"Frozen parameters (requires_grad=False, not listed): {rep.frozen_params}")
    return lines


def render_text(rep: GradReport) -> str:
    parts = ["\n".join(header_lines(rep)), "",
             "Layers (forward order; gradient wrt the layer's output, and wrt its input through this layer only)",
             plain_table(LAYER_COLUMNS, layer_rows(rep)), "", "Parameters",
             plain_table(PARAM_COLUMNS, param_rows(rep)), "", "Checks",
             plain_table(CHECK_COLUMNS, check_rows(rep))]
    return "\n".join(parts) + "\n"


def render_rich(rep: GradReport) -> list[Any]:
    return ["\n".join(header_lines(rep)),
            rich_table(LAYER_COLUMNS, layer_rows(rep), title="Layers (gradient wrt output / wrt input)"),
            rich_table(PARAM_COLUMNS, param_rows(rep), title="Parameters"),
            rich_table(CHECK_COLUMNS, check_rows(rep), title="Checks")]


# ----------------------------------------------------------------- figures
def _figure(w: float, h: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h), dpi=FIG_DPI)


def _pos(v: float | None) -> float:
    # log axes cannot show 0: draw it at the bottom instead of dropping the layer.
    return v if v is not None and v > 0 and math.isfinite(v) else float("nan")


def flow_figure(rep: GradReport) -> Any:
    """Mean and max |grad| per layer (wrt its output) and per weight, log scale, forward order.
    Readable x labels (8 pt), the legend beside the bars (never over them), titles apart."""
    reached = [r for r in rep.layers if r.grad_output is not None]
    weights = [p for p in rep.params if p.has_grad and len(p.shape) > 1]
    longest = max([len(r.key) for r in reached] + [len(p.name) for p in weights] + [4])
    label_in = min(0.065 * longest + 0.1, 3.0)  # room under each panel for the rotated names
    plot_in, title_in = 2.6, 0.4
    h = 2 * (title_in + plot_in + label_in + 0.1)
    fig = _figure(13, h)
    # Fixed axes rectangles instead of tight_layout: fast, and titles never meet labels.
    ax1 = fig.add_axes((0.06, (h / 2 + label_in + 0.1) / h, 0.82, plot_in / h))
    ax2 = fig.add_axes((0.06, (label_in + 0.1) / h, 0.82, plot_in / h))
    xs = list(range(len(reached)))
    ax1.bar(xs, [_pos(_max_abs(r.grad_output)) for r in reached], color="c", alpha=0.5, label="max |grad|")
    ax1.bar(xs, [_pos(_rep(r.grad_output).abs_mean) for r in reached], color="b", alpha=0.7,
            label="mean |grad|")
    ax1.set_title("Gradient wrt each layer's output (forward order)", fontsize=10)
    xw = list(range(len(weights)))
    ax2.bar(xw, [_pos(p.max_abs) for p in weights], color="c", alpha=0.5, label="max |grad|")
    ax2.bar(xw, [_pos(abs(p.mean) if p.mean is not None else None) for p in weights], color="b", alpha=0.7,
            label="|mean grad|")
    ax2.set_title("Gradient of each weight (biases and norms left out), as plot_grad_flow draws it", fontsize=10)
    bad_layers = [_kind(r.grad_output) for r in reached]
    bad_weights = ["NaN" if p.nan_count else "Inf" if p.inf_count else "" for p in weights]
    for ax, labels, bad in ((ax1, [r.key for r in reached], bad_layers), (ax2, [p.name for p in weights], bad_weights)):
        _mark_nonfinite(ax, bad)
        if labels:
            ax.set_yscale("log")
            step = max(1, math.ceil(len(labels) / 70))
            ax.set_xticks(list(range(0, len(labels), step)))
            ax.set_xticklabels([one_line(t) for t in labels[::step]], rotation=90,
                               fontsize=8 if len(labels) <= 70 else 7)
            ax.set_xlim(-0.6, len(labels) - 0.4)
            ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, borderaxespad=0.0)
        else:
            ax.text(0.5, 0.5, "nothing to show", ha="center", va="center", transform=ax.transAxes)
        ax.set_ylabel("|gradient| (log)", fontsize=9)
        ax.tick_params(axis="y", labelsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    return fig


def _kind(s: Any) -> str:
    return "" if s is None or s.finite else ("NaN" if s.nan_count else "Inf")


def _mark_nonfinite(ax: Any, bad: list[str]) -> None:
    """A red band and a "NaN"/"Inf" label over each bar whose gradient is not finite: it has
    no height on a log axis, and an empty slot must not read as a zero gradient (issue 29)."""
    from matplotlib.transforms import blended_transform_factory

    where = [(x, k) for x, k in enumerate(bad) if k]
    if not where:
        return
    tr = blended_transform_factory(ax.transData, ax.transAxes)
    for i, (x, k) in enumerate(where):
        ax.axvspan(x - 0.4, x + 0.4, color="#d62728", alpha=0.25, lw=0,
                   label="NaN/Inf gradient" if i == 0 else None)
        ax.text(x, 0.97, k, transform=tr, rotation=90, ha="center", va="top", fontsize=7, color="#b00020",
                fontweight="bold")
    if all(bad):  # nothing finite to set the log axis: give it a range
        ax.set_ylim(1e-8, 1.0)


HIST_PER_PAGE = 24  # panels per histogram page (6 x 4)
HIST_COLS = 6


def histogram_pages(rep: GradReport, per_page: int = HIST_PER_PAGE) -> list[Any]:
    """Histograms of log10|grad wrt output| of EVERY reached layer (forward order), one
    panel per layer, ``per_page`` panels a page; one shared x range so panels compare.
    Drawn with Pillow (PIL images): no figure layout to wait for."""
    reached = [r for r in rep.layers if r.grad_output is not None]
    edges = rep.layers[0].hist.edges() if rep.layers else [0.0, 1.0]
    lows = [r.hist.min for r in reached if sum(r.hist.counts)]
    highs = [r.hist.max for r in reached if sum(r.hist.counts)]
    lo = max(edges[0], math.floor(min(lows)) - 0.5) if lows else edges[0]
    hi = min(edges[-1], math.ceil(max(highs)) + 0.5) if highs else edges[-1]
    chunks = [reached[i:i + per_page] for i in range(0, len(reached), per_page)] or [[]]
    return [_histogram_page(chunk, edges, lo, hi, page + 1, len(chunks), len(reached))
            for page, chunk in enumerate(chunks)]


def _histogram_page(layers: Sequence[LayerGrad], edges: Sequence[float], lo: float, hi: float, page: int,
                    pages: int, total: int) -> Any:
    from PIL import Image, ImageDraw

    from inspect_model.render import raster

    pw, ph, fs = 230, 150, 11  # panel size, font size
    cols = HIST_COLS
    rows = max(1, math.ceil(len(layers) / cols))
    head = 44
    img = Image.new("RGB", (cols * pw + 16, head + rows * ph + 8), raster.BG)
    d = ImageDraw.Draw(img)
    d.text((img.size[0] // 2, 8), f"log10 |gradient wrt layer output| per layer (page {page} of {pages}, "
           f"{total} layers)", font=raster.font(13, True), fill=raster.FG, anchor="ma")
    d.text((img.size[0] // 2, 26), "x: log10 |g| (shared range); y: count, each panel scaled to its own peak; "
           "zeros counted apart", font=raster.font(fs), fill=raster.MUTED, anchor="ma")
    xt = [t for t in range(math.ceil(lo), math.floor(hi) + 1)]
    if len(xt) > 6:
        k = math.ceil(len(xt) / 6)
        xt = [t for t in xt if t % k == 0]
    for i, r in enumerate(layers):
        row, col = divmod(i, cols)
        x0, y0 = 8 + col * pw, head + row * ph
        px0, px1 = x0 + 8, x0 + pw - 10  # plot area
        py0, py1 = y0 + fs + 8, y0 + ph - fs - 14
        o = r.grad_output
        odd = "" if o is None or getattr(o, "finite", True) else f", NaN {o.nan_count}, Inf {o.inf_count}"
        d.text((x0 + pw // 2, y0 + 2), raster.fit_text(f"{r.key} (zeros {r.hist.zeros}{odd})", fs, pw - 12),
               font=raster.font(fs), fill=(176, 0, 32) if odd else raster.FG, anchor="ma")
        d.rectangle((px0, py0, px1, py1), outline=(170, 170, 170))
        peak = max(r.hist.counts) if r.hist.counts else 0

        def sx(v: float, px0: int = px0, px1: int = px1) -> float:
            return px0 + (v - lo) / (hi - lo) * (px1 - px0)

        if peak > 0:
            for c, a, b in zip(r.hist.counts, edges[:-1], edges[1:]):
                if c and b > lo and a < hi:
                    top = py1 - (py1 - py0 - 2) * c / peak
                    d.rectangle((max(sx(a), px0), top, min(sx(b), px1), py1), fill=(31, 119, 180))
        else:
            d.text(((px0 + px1) // 2, (py0 + py1) // 2), "NaN/Inf and zeros only" if odd else "all zero",
                   font=raster.font(fs), fill=(176, 0, 32) if odd else raster.MUTED, anchor="mm")
        for t in xt:
            x = sx(t)
            d.line((x, py1, x, py1 + 3), fill=raster.FG)
            d.text((x, py1 + 4), str(t), font=raster.font(fs - 1), fill=raster.FG, anchor="ma")
    return img


# ----------------------------------------------------------------- jacobian
JAC_COLUMNS = [Column("of"), Column("wrt"), Column("input"), Column("|d(sum of)/d(wrt)|", "right"),
               Column("mean |g|", "right"), Column("max |g|", "right"), Column("||J||_F est.", "right"),
               Column("std. error", "right")]


def jacobian_rows(results: Sequence[JacobianResult]) -> list[list[str]]:
    rows = []
    for r in results:
        v = r.vjp.reported()
        rows.append([r.of, r.wrt, f"batch of {len(r.names)}", fmt(v.norm), fmt(v.abs_mean),
                     fmt(_max_abs(r.vjp)), fmt(r.norm), fmt(r.norm_se)])
        for i, name in enumerate(r.names):
            est = math.sqrt(r.sample_norm_sq[i]) if i < len(r.sample_norm_sq) else None
            rows.append(["", "", name, fmt(r.sample_norms[i]) if i < len(r.sample_norms) else "-", "", "",
                         fmt(est), ""])
    return rows


def render_jacobian_text(results: Sequence[JacobianResult]) -> str:
    r0 = results[0]
    head = (f"d({r0.of})/d({r0.wrt}): vector-Jacobian product with "
            + ("the target one-hot" if r0.of == "score" else "a ones vector"))
    if r0.probes:
        head += f"; ||J||_F estimated from {r0.probes} Gaussian probes (E||J^T v||^2), with its standard error"
    return head + "\n" + plain_table(JAC_COLUMNS, jacobian_rows(results)) + "\n"


def render_jacobian_rich(results: Sequence[JacobianResult]) -> list[Any]:
    return [rich_table(JAC_COLUMNS, jacobian_rows(results), title=f"d({results[0].of})/d({results[0].wrt})")]


def jacobian_figure(r: JacobianResult, max_images: int = 8) -> Any:
    """mean over channels of |d(sum of)/d(wrt)| for each input, when ``wrt`` is spatial."""
    assert r.grad_map is not None
    maps = r.grad_map[:max_images]
    n = maps.shape[0]
    fig = _figure(3.0 * n, 3.4)
    axes = fig.subplots(1, n, squeeze=False)
    for i in range(n):
        ax = axes[0][i]
        im = ax.imshow(maps[i].numpy(), cmap="magma")
        ax.set_title(one_line(r.names[i])[-30:], fontsize=7)
        ax.axis("off")
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.suptitle(f"mean over channels of |d({r.of})/d({r.wrt})|", fontsize=9)
    return fig
