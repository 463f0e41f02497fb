"""The ``compare`` report on stdout, its report.html tables and ``compare_depth.png``.

Reads the :class:`~inspect_model.methods.compare.report.CompareReport` record (or its
``to_dict()``), by attribute names only: render/ imports no methods/.
"""

from __future__ import annotations

import math
from typing import Any

from inspect_model.output.sink import Drawer, Sink
from inspect_model.render.table import Column, plain_table

FIG_DPI = 100
MOST_ROWS = 400  # stdout lists at most this many layers (the JSON and report.html have all)


def fmt(v: Any, spec: str = ".3g") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return str(v)
    return format(v, spec)


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100.0 * v:.2f}%"


def _headline(rec: Any) -> list[str]:
    how = ", ".join(f"{k} {v}" for k, v in sorted(rec.matched_by.items())) or "none"
    lines = [f"compare {rec.mode}: A = {rec.model}; B = {rec.other} ({rec.against}); {rec.matched} layers matched "
             f"({how}); tolerance {rec.tolerance:g}"]
    if rec.first_divergent is None:
        lines.append(f"no layer past the tolerance {rec.tolerance:g}")
    else:
        rows = {r.name: r for r in (*rec.layers, *rec.weights)}
        row = rows.get(rec.first_divergent)
        err = getattr(row, "relative_error", getattr(row, "relative_change", None))
        grow = f"; the error grows x{rec.growth:.3g} from there to the last layer" if rec.growth else ""
        lines.append(f"first divergent layer: {rec.first_divergent} (relative error {fmt(err)}, status "
                     f"{getattr(row, 'status', 'past')}){grow}")
    if rec.fail_above is not None:
        lines.append(f"--fail-above {rec.fail_above:g}: " + (f"FAIL at {rec.first_failing}" if rec.first_failing
                                                              else "pass"))
    for side, name in (("A", rec.nonfinite_origin_a), ("B", rec.nonfinite_origin_b)):
        if name:
            lines.append(f"NaN/Inf first produced on side {side} by {name}")
    if rec.overflow_layers:
        lines.append(f"overflow (values of A beyond B's dtype's range) in: {', '.join(rec.overflow_layers[:10])}")
    if rec.underflow_layers:
        lines.append(f"underflow (non-zero values of A below B's smallest normal) in {len(rec.underflow_layers)} "
                     f"layer(s), first {rec.underflow_layers[0]}")
    return lines


def _layer_table(rec: Any) -> str:
    cols = (Column("#", "right"), Column("layer"), Column("type"), Column("rel.err", "right"),
            Column("max|a-b|", "right"), Column("cosine", "right"), Column(">tol", "right"),
            Column("growth", "right"), Column("over/under", "right"), Column("status"))
    rows = []
    for i, r in enumerate(rec.layers[:MOST_ROWS]):
        ou = "-" if r.overflow is None else f"{r.overflow}/{r.underflow}"
        rows.append([str(i), r.name if r.other == r.name else f"{r.name} ~ {r.other}", r.type,
                     fmt(r.relative_error), fmt(r.max_abs_error), fmt(r.cosine, ".6f"), _pct(r.beyond_tolerance),
                     fmt(r.growth), ou, r.status])
    return plain_table(cols, rows)


def _weight_table(rec: Any) -> str:
    cols = (Column("layer"), Column("type"), Column("values", "right"), Column("||a||", "right"),
            Column("||a-b||", "right"), Column("rel.change", "right"), Column("max|a-b|", "right"))
    rows = [[r.name if r.other == r.name else f"{r.name} ~ {r.other}", r.type, str(r.values), fmt(r.norm),
             fmt(r.norm_diff), fmt(r.relative_change), fmt(r.max_abs)] for r in rec.weights[:MOST_ROWS]]
    return plain_table(cols, rows)


def compare_text(rec: Any) -> str:
    lines = _headline(rec)
    lines += ["", _weight_table(rec) if rec.mode == "weights" else _layer_table(rec)]
    if len(rec.layers) > MOST_ROWS or len(rec.weights) > MOST_ROWS:
        lines.append(f"(first {MOST_ROWS} layers; --json or -o DIR has them all)")
    for o in rec.outputs:
        agree = "" if o.top1_agreement is None else f"top-1 agreement {_pct(o.top1_agreement)}, "
        if o.shape != o.other_shape:
            lines.append(f"output {o.key or '(model)'}: shapes differ, {list(o.shape)} against {list(o.other_shape)}")
        else:
            lines.append(f"output {o.key or '(model)'}: {agree}largest change {fmt(o.max_abs_change)}, relative error "
                         f"{fmt(o.relative_error)}, cosine {fmt(o.cosine, '.6f')}")
    if rec.unmatched_a:
        lines.append(f"unmatched layers of A ({len(rec.unmatched_a)}): {', '.join(rec.unmatched_a[:20])}")
    if rec.unmatched_b:
        lines.append(f"unmatched layers of B ({len(rec.unmatched_b)}): {', '.join(rec.unmatched_b[:20])}")
    mem = rec.memory
    if mem.mode != "none":
        budget = f" (budget {mem.budget_bytes / 2**20:.0f} MiB)" if mem.budget_bytes else ""
        lines.append(f"memory: {mem.mode}{budget}, at most {mem.peak_outputs} of B's layer outputs held at once "
                     f"({mem.peak_bytes / 2**20:.1f} MiB)")
    return "\n".join(lines) + "\n"


def compare_report(r: Any, rich: bool) -> Any:
    text = compare_text(r.record)
    return [text] if rich else text


def compare_tables(doc: dict[str, Any]) -> list[Any]:
    """report.html: one row per layer (or per layer's weights), then the outputs."""
    from inspect_model.render.html_columns import at

    layers = [("#", at("order")), ("layer", at("name")), ("B's layer", at("other")), ("type", at("type")),
              ("relative error", at("relative_error")), ("max |a-b|", at("max_abs_error")),
              ("1 - cosine", _one_minus(at("cosine"))), ("share > tol", at("beyond_tolerance")), ("growth", at("growth")), ("overflow", at("overflow")),
              ("underflow", at("underflow")), ("NaN/Inf A", at("nonfinite_a")), ("NaN/Inf B", at("nonfinite_b")),
              ("status", at("status"))]
    weights = [("layer", at("name")), ("B's layer", at("other")), ("type", at("type")), ("values", at("values")),
               ("||a||", at("norm")), ("||a-b||", at("norm_diff")), ("relative change", at("relative_change")),
               ("max |a-b|", at("max_abs"))]
    outputs = [("output", at("key")), ("relative error", at("relative_error")),
               ("largest change", at("max_abs_change")), ("cosine", at("cosine")),
               ("top-1 agreement", at("top1_agreement"))]
    return [("Layers (A's forward order): first divergent " + str(doc.get("first_divergent")), doc.get("layers") or [],
             layers), ("Weights (per layer)", doc.get("weights") or [], weights),
            ("Outputs", doc.get("outputs") or [], outputs)]


def _one_minus(get: Any) -> Any:
    """1 − cosine: near 1 a cosine's digits say nothing in a table; its distance from 1 does."""
    def one_minus(rec: dict[str, Any]) -> Any:
        v = get(rec)
        return None if v is None else max(0.0, 1.0 - v)
    return one_minus


class CompareDrawer(Drawer):
    """``compare_depth.png``: the error along depth."""

    def draw_summary(self, sink: Sink, result: Any) -> None:
        if sink.out is None:
            return
        sink.figure("compare_depth.png", depth_figure(result.record), dpi=FIG_DPI)


def _series(rec: Any) -> tuple[list[str], dict[str, list[float | None]], str | None]:
    if rec.mode == "weights":
        rows = list(rec.weights)
        return [r.name for r in rows], {"relative change ||a-b||/||a||": [r.relative_change for r in rows],
                                        "max |a-b|": [r.max_abs for r in rows]}, rec.first_divergent
    rows = list(rec.layers)
    return [r.name for r in rows], {
        "relative error ||a-b||/||a||": [r.relative_error for r in rows],
        "max |a-b|": [r.max_abs_error for r in rows],
        "1 - cosine": [None if r.cosine is None else max(0.0, 1.0 - r.cosine) for r in rows],
        "share of elements > tolerance": [r.beyond_tolerance for r in rows]}, rec.first_divergent


def depth_figure(rec: Any) -> Any:
    """One line per statistic along A's layers (log scale). Exact zeros cannot sit on a log
    axis: they are drawn as hollow markers on a floor line labelled "0", below every
    non-zero value; missing values leave a gap. The first divergent layer is marked."""
    from matplotlib.figure import Figure

    names, series, first = _series(rec)
    fig = Figure(figsize=(13, 5.6), dpi=FIG_DPI)
    ax = fig.add_axes((0.07, 0.30, 0.62, 0.60))
    pos = [v for vals in series.values() for v in vals if v is not None and v > 0 and math.isfinite(v)]
    floor = 10 ** math.floor(math.log10(min(pos))) / 10 if pos else 1e-12
    x = list(range(len(names)))
    for (label, vals), color in zip(series.items(), ("C0", "C1", "C2", "C3")):
        ys = [float("nan") if v is None or not math.isfinite(v) else max(v, floor) for v in vals]
        ax.plot(x, ys, "-", color=color, label=label, linewidth=1.4)
        zx = [i for i, v in enumerate(vals) if v == 0]
        ax.plot(zx, [floor] * len(zx), "o", mfc="none", color=color, markersize=4)
    ax.set_yscale("log")
    ax.axhline(floor, color="0.6", linestyle=":", linewidth=1)
    ax.text(1.005, floor, " 0 (exact)", transform=ax.get_yaxis_transform(), va="center", fontsize=8, color="0.4")
    if rec.mode != "weights":
        ax.axhline(rec.tolerance, color="0.3", linestyle="--", linewidth=1, label=f"tolerance {rec.tolerance:g}")
    if first in names:
        i = names.index(first)
        ax.axvline(i, color="black", linestyle="-.", linewidth=1.5, label=f"first divergent: {first}")
    ax.set_xlim(-0.5, max(len(names) - 0.5, 0.5))
    step = max(1, math.ceil(len(names) / 60))
    ax.set_xticks(x[::step])
    ax.set_xticklabels([n or "(model)" for n in names[::step]], rotation=90, fontsize=7)
    ax.set_xlabel("layer of A, in forward order" if rec.mode != "weights" else "layer of A, in module order",
                  fontsize=9)
    ax.set_ylabel("error (log scale)", fontsize=9)
    ax.set_title(f"{rec.model} vs {rec.other} ({rec.against}): error along depth ({rec.mode})", fontsize=11)
    ax.grid(True, which="major", axis="y", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.08, 1.0), fontsize=8, frameon=False)
    return fig
